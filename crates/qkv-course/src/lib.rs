//! The qkv lesson pipeline.
