"""The file layer of :mod:`attngeom.models`: safetensors files, checkpoints (sharded folders,
the Hugging Face cache, packaged models, tensors in memory), config.json and the
:class:`Architecture` it describes, the other JSON files, tokenizers, and each family's
tensor names, by which the heads and the forward pass's weights are read. It imports nothing
of :mod:`..nn` or :mod:`..analysis`.
"""
