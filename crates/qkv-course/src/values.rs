//! Computed records as a tree of named values, addressed by dotted paths
//! (`sentence.love.weights.NLP`).

/// What resolves a citation's path to its value: the evaluator, seen from the layers below it.
pub(crate) trait Resolve {
    /// The value `path` names, as written in document `doc`; `Err` says what was expected (empty
    /// when another reported problem already explains it).
    fn resolve(&mut self, doc: usize, path: &str) -> Result<Node, String>;
}

/// One computed value or a named collection of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// A number at full precision.
    Number(f64),
    /// Text, such as an engine error message.
    Text(String),
    /// Items addressed by label (a token) or by 1-based position.
    List(Vec<(String, Node)>),
    /// Named fields.
    Map(Vec<(&'static str, Node)>),
    /// Entries named by their labels only (an attention example's fields beside its queries):
    /// unlike a list, never by position, so `sentence.10` cannot mean its tenth entry.
    Record(Vec<(String, Node)>),
}

/// Why a path did not resolve: which segment failed and what would have worked there.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Miss {
    /// Index of the segment that did not resolve.
    pub segment: usize,
    /// The names that segment could have been.
    pub known: Vec<String>,
}

impl Node {
    /// A list labelled `1..=n`.
    pub(crate) fn numbered(items: impl IntoIterator<Item = Node>) -> Self {
        Node::List(items.into_iter().enumerate().map(|(i, n)| ((i + 1).to_string(), n)).collect())
    }

    /// A list of numbers labelled `1..=n`.
    pub(crate) fn vector(xs: &[f64]) -> Self {
        Self::numbered(xs.iter().map(|&x| Node::Number(x)))
    }

    /// A list labelled by `labels`.
    pub(crate) fn labelled(labels: &[String], items: impl IntoIterator<Item = Node>) -> Self {
        Node::List(labels.iter().cloned().zip(items).collect())
    }

    /// Follows `path` from this node.
    pub(crate) fn lookup(&self, path: &[&str]) -> Result<&Node, Miss> {
        let mut node = self;
        for (i, segment) in path.iter().enumerate() {
            let next = match node {
                Node::Map(fields) => fields.iter().find(|(k, _)| k == segment).map(|(_, n)| n),
                Node::Record(entries) => entries.iter().find(|(k, _)| k == segment).map(|(_, n)| n),
                Node::List(items) => items.iter().find(|(k, _)| k == segment).map(|(_, n)| n).or_else(|| {
                    segment
                        .parse::<usize>()
                        .ok()
                        .and_then(|p| p.checked_sub(1))
                        .and_then(|p| items.get(p))
                        .map(|(_, n)| n)
                }),
                Node::Number(_) | Node::Text(_) => None,
            };
            node = next.ok_or_else(|| Miss { segment: i, known: node.children() })?;
        }
        Ok(node)
    }

    /// The names one level down, for "expected one of" messages.
    pub(crate) fn children(&self) -> Vec<String> {
        match self {
            Node::Map(fields) => fields.iter().map(|(k, _)| k.to_string()).collect(),
            Node::List(items) | Node::Record(items) => items.iter().map(|(k, _)| k.clone()).collect(),
            Node::Number(_) | Node::Text(_) => Vec::new(),
        }
    }

    /// A number, also from a one-item list (a 1-wide value row reads as a scalar).
    pub(crate) fn as_number(&self) -> Option<f64> {
        match self {
            Node::Number(x) => Some(*x),
            Node::List(items) if items.len() == 1 => items[0].1.as_number(),
            _ => None,
        }
    }

    /// A list of numbers.
    pub(crate) fn as_vector(&self) -> Option<Vec<f64>> {
        match self {
            Node::List(items) => items.iter().map(|(_, n)| n.as_number()).collect(),
            _ => None,
        }
    }

    /// A list of numbers with their labels (`[("I", 0.2), ("love", 0.5), …]`).
    pub(crate) fn numbers(&self) -> Option<Vec<(String, f64)>> {
        match self {
            Node::List(items) => items.iter().map(|(k, n)| Some((k.clone(), n.as_number()?))).collect(),
            _ => None,
        }
    }

    /// A list of rows of numbers.
    pub(crate) fn as_matrix(&self) -> Option<Vec<Vec<f64>>> {
        match self {
            Node::List(items) => items.iter().map(|(_, n)| n.as_vector()).collect(),
            _ => None,
        }
    }

    /// Every leaf as `prefix.path = value`, numbers at full precision: the record's snapshot.
    pub(crate) fn dump(&self, prefix: &str, out: &mut String) {
        match self {
            Node::Number(x) => out.push_str(&format!("{prefix} = {x:?}\n")),
            Node::Text(t) => out.push_str(&format!("{prefix} = {t:?}\n")),
            Node::List(items) | Node::Record(items) => {
                for (k, n) in items {
                    n.dump(&format!("{prefix}.{k}"), out);
                }
            }
            Node::Map(fields) => {
                for (k, n) in fields {
                    n.dump(&format!("{prefix}.{k}"), out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
