"""The types the package's annotations name, for type checkers only: nothing here is imported at
run time (NumPy users need no torch, PyTorch users no NumPy)."""

from typing import TYPE_CHECKING, Sequence, Tuple, Union

if TYPE_CHECKING:
    import numpy
    import torch

    #: A torch tensor or a NumPy array: a call returns the library its inputs came in.
    Array = Union[torch.Tensor, numpy.ndarray]
    #: Per-head numbers (ALiBi slopes, sink logits): a list, an array or a tensor.
    PerHead = Union[Sequence[float], numpy.ndarray, torch.Tensor]
    #: Packed sequences' offsets (flash-attn's ``cu_seqlens``): a list, an array or an integer tensor.
    Offsets = Union[Sequence[int], numpy.ndarray, torch.Tensor]
    #: A sliding window ``(before, after)``, -1 or None for no limit on a side.
    Window = Tuple[Union[int, None], Union[int, None]]
    #: A scale: a number, or a tensor of one element that does not require grad.
    Scale = Union[float, torch.Tensor]
