//! qkv command line.
fn main() {}
