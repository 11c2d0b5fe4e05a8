//! End-to-end tests of the whole qkv pipeline: the xtask binary, content checks, the calculator.
