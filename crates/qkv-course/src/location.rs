//! Byte offsets to `line:column` positions within one source file.

/// Line starts of one text, for turning byte offsets into 1-based line and column numbers.
#[derive(Debug, Clone)]
pub(crate) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub(crate) fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self { starts }
    }

    /// 1-based line and column (in characters) of byte `offset` in `text`.
    pub(crate) fn position(&self, text: &str, offset: usize) -> (usize, usize) {
        let offset = offset.min(text.len());
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts[line - 1];
        let column = text.get(start..offset).map_or(1, |s| s.chars().count() + 1);
        (line, column)
    }
}
