//! Figures for the qkv lesson.
