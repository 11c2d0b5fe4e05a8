//! qkv: scaled dot-product attention on the CPU.
