"""The extension module's public names; the rest serves the package itself."""

from typing import Any, List

__version__: str

def simd_report() -> str:
    """One line naming the SIMD level the kernels run at and why."""

def alibi_slopes(heads: int) -> List[float]:
    """The ALiBi paper's slopes for ``heads`` heads."""

def __getattr__(name: str) -> Any: ...
