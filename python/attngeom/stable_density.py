# TEMPORARY placeholder
def stable_density(x, alpha, c=1.0, *, log=False):
    raise NotImplementedError
