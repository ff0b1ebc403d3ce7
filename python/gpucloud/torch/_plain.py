"""Plain data with tensors in it (state dicts), as JSON: numbers, strings, bools, None, lists,
tuples, dicts with str or int keys, and tensors as stubs a caller chooses. No pickle: what is
decoded is data, never code. Shared by broadcast_optimizer_state and the torch checkpoints."""
import torch

MAX_DEPTH = 32
# The dtypes a stub may name ("float32", "bool", ...): what state dicts hold.
DTYPES = {str(t).split(".")[1]: t for t in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}


def encode(value, where, on_tensor, depth=0):
    """``value`` as JSON-able data; each tensor becomes ``on_tensor(tensor, where)`` (a dict with
    "__tensor__"). A value of any other type is a TypeError naming ``where``."""
    if depth > MAX_DEPTH:
        raise TypeError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, torch.Tensor):
        return on_tensor(value, where)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, (list, tuple)):
        items = [encode(v, f"{where}[{i}]", on_tensor, depth + 1) for i, v in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        pairs = []
        for k in value:
            if isinstance(k, bool) or not isinstance(k, (int, str)):
                raise TypeError(f"{where}: a key of type {type(k).__name__} (str or int keys only)")
            pairs.append([k, encode(value[k], f"{where}[{k!r}]", on_tensor, depth + 1)])
        return {"__dict__": pairs}
    raise TypeError(f"{where}: a {type(value).__name__} cannot be stored (plain data and tensors only)")


def decode(value, on_tensor, depth=0):
    """The inverse of ``encode``; ``on_tensor(stub)`` gives each tensor back. Malformed input
    raises ValueError, KeyError, TypeError or IndexError."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        return [decode(v, on_tensor, depth + 1) for v in value]
    if isinstance(value, dict):
        if "__tensor__" in value:
            return on_tensor(value)
        if "__tuple__" in value:
            return tuple(decode(v, on_tensor, depth + 1) for v in value["__tuple__"])
        pairs = value["__dict__"]
        out = {}
        for k, v in pairs:
            if isinstance(k, bool) or not isinstance(k, (int, str)):
                raise TypeError(f"a key of type {type(k).__name__}")
            out[k] = decode(v, on_tensor, depth + 1)
        return out
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise TypeError(f"a {type(value).__name__}")
    return value
