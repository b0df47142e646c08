"""The file layer of :mod:`attngeom.models`: safetensors files, checkpoints (sharded folders,
the Hugging Face cache, packaged models, tensors in memory), config.json and the other JSON
files, tokenizers, and each family's tensor-name map. It imports nothing of :mod:`..nn` or
:mod:`..analysis`.
"""
