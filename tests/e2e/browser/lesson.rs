//! What the browser tests expect, read from the lesson itself (never from the page's script
//! data): the examples' inputs through `qkv_course::records`, the quiz, widget and settings
//! blocks as the author wrote them, and the engine's f64 reference for any query.

use std::collections::BTreeMap;
use std::fs;
use std::sync::OnceLock;

use ndarray::Array2;
use qkv::{AttentionOptions, QueryTrace};
use qkv_course::{SourceFile, Sources};

use crate::content::content_dir;

/// One section of the lesson: its page and the blocks it declares.
pub struct Section {
    /// Its `# Title`.
    pub title: String,
    /// `attention` for `01-attention.md`: the page name and the progress key.
    pub id: String,
    /// Its `qkv quiz` blocks, in reading order.
    pub quizzes: Vec<Quiz>,
    /// Its `qkv widget` blocks, in reading order.
    pub widgets: Vec<toml::Table>,
    /// Its `qkv decode` blocks, in reading order.
    pub decodes: Vec<toml::Table>,
    /// Its `qkv attention` blocks, in reading order (for the masks, which records do not list).
    pub examples: Vec<toml::Table>,
    /// Credit for a right answer on try 1, 2, 3 (its `qkv settings` block, or the default).
    pub credit: Vec<f64>,
    /// Every `qkv` block, as (KIND, its TOML), in reading order.
    pub blocks: Vec<(String, toml::Table)>,
}

impl Section {
    /// The `qkv KIND` block with `id`.
    pub fn block(&self, kind: &str, id: &str) -> &toml::Table {
        self.blocks
            .iter()
            .find(|(k, t)| k == kind && t.get("id").and_then(toml::Value::as_str) == Some(id))
            .map(|(_, t)| t)
            .unwrap_or_else(|| panic!("section {} has no `qkv {kind}` block `{id}`", self.id))
    }
}

/// A `qkv quiz` block.
pub struct Quiz {
    pub id: String,
    pub kind: String,
    pub practice: bool,
    pub block: toml::Table,
}

impl Quiz {
    /// The options' letters, `a`, `b`, … in order, each with whether it is the right one.
    pub fn options(&self) -> Vec<(char, bool)> {
        let options =
            self.block.get("options").and_then(toml::Value::as_array).map_or(&[][..], Vec::as_slice);
        options
            .iter()
            .zip('a'..='z')
            .map(|(o, letter)| (letter, o.get("correct").and_then(toml::Value::as_bool).unwrap_or(false)))
            .collect()
    }

    /// The right option's letter and the wrong ones'.
    pub fn letters(&self) -> (char, Vec<char>) {
        let options = self.options();
        let right: Vec<char> = options.iter().filter(|(_, r)| *r).map(|(l, _)| *l).collect();
        assert_eq!(right.len(), 1, "quiz {} must have exactly one right option", self.id);
        (right[0], options.iter().filter(|(_, r)| !r).map(|(l, _)| *l).collect())
    }

    pub fn has_hint(&self) -> bool {
        self.block.contains_key("hint")
    }

    /// A string field.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.block.get(name).and_then(toml::Value::as_str)
    }
}

/// What a widget block names, whatever its example (see [`Lesson::widget_names`]).
pub struct WidgetNames {
    pub root: String,
    pub page: String,
    pub section: String,
    pub example: String,
    pub digits: usize,
}

/// The whole lesson, read once per test binary.
pub struct Lesson {
    pub sections: Vec<Section>,
    /// Every computed value as `section.path` → its listing text (`1.0`, `"I"`).
    records: BTreeMap<String, String>,
    /// Every `section.path` in the order the records list them (a record's entries as declared).
    paths: Vec<String>,
}

/// The lesson in `content/`.
pub fn lesson() -> &'static Lesson {
    static LESSON: OnceLock<Lesson> = OnceLock::new();
    LESSON.get_or_init(read)
}

fn read() -> Lesson {
    let dir = content_dir();
    let mut paths: Vec<_> = fs::read_dir(&dir)
        .expect("content folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "md") && p.file_name().is_some_and(|n| n != "README.md")
        })
        .collect();
    paths.sort();
    let markdown: Vec<SourceFile> = paths
        .iter()
        .map(|p| SourceFile {
            path: format!("content/{}", p.file_name().and_then(|n| n.to_str()).expect("utf-8 name")),
            text: fs::read_to_string(p).expect("lesson file"),
        })
        .collect();
    // The data files that `measurements` figures draw.
    let data = fs::read_dir(dir.join("data"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    Some((format!("data/{name}"), fs::read_to_string(e.path()).ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let sources = Sources { markdown, data, ..Default::default() };
    let mut records = BTreeMap::new();
    let mut paths = Vec::new();
    for (_, listing) in qkv_course::records(&sources).expect("the lesson evaluates") {
        for line in listing.lines() {
            if let Some((path, value)) = line.split_once(" = ") {
                records.insert(path.to_string(), value.to_string());
                paths.push(path.to_string());
            }
        }
    }
    let sections = sources.markdown.iter().map(section).collect();
    Lesson { sections, records, paths }
}

fn section(file: &SourceFile) -> Section {
    let blocks = blocks(&file.text);
    let of = |kind: &str| -> Vec<toml::Table> {
        blocks.iter().filter(|(k, _)| k == kind).map(|(_, t)| t.clone()).collect()
    };
    let quizzes = of("quiz")
        .into_iter()
        .map(|block| Quiz {
            id: block.get("id").and_then(toml::Value::as_str).expect("a quiz has an id").to_string(),
            kind: block.get("kind").and_then(toml::Value::as_str).unwrap_or("choice").to_string(),
            practice: block.get("practice").and_then(toml::Value::as_bool).unwrap_or(false),
            block,
        })
        .collect();
    let credit = of("settings")
        .iter()
        .find_map(|t| t.get("credit").and_then(toml::Value::as_array).cloned())
        .map(|c| {
            c.iter().map(|x| x.as_float().or(x.as_integer().map(|i| i as f64)).expect("a credit")).collect()
        })
        .unwrap_or_else(|| vec![1.0, 0.5, 0.25]);
    // The title is the first line that is a level-1 heading (no fenced block comes before it).
    let title = file.text.lines().find_map(|l| l.strip_prefix("# ")).unwrap_or_default().trim().to_string();
    Section {
        id: qkv_course::section_id(&file.path),
        title,
        quizzes,
        widgets: of("widget"),
        decodes: of("decode"),
        credit,
        examples: of("attention"),
        blocks,
    }
}

/// Every fenced ```` ```qkv KIND ```` block of `text` as (KIND, its TOML).
fn blocks(text: &str) -> Vec<(String, toml::Table)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(kind) = line.strip_prefix("```qkv ") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        let table =
            body.join("\n").parse::<toml::Table>().unwrap_or_else(|e| panic!("qkv {kind} block: {e}"));
        out.push((kind.trim().to_string(), table));
    }
    out
}

impl Lesson {
    /// The quiz `id` and its section.
    pub fn quiz(&self, id: &str) -> (&Section, &Quiz) {
        self.sections
            .iter()
            .find_map(|s| s.quizzes.iter().find(|q| q.id == id).map(|q| (s, q)))
            .unwrap_or_else(|| panic!("the lesson has no quiz `{id}` (issue 8's contract, section 4)"))
    }

    /// The first widget block of `kind` in any section, and its section.
    pub fn widget_block(&self, kind: &str) -> (&Section, &toml::Table) {
        self.sections
            .iter()
            .find_map(|s| {
                s.widgets
                    .iter()
                    .find(|w| w.get("kind").and_then(toml::Value::as_str) == Some(kind))
                    .map(|w| (s, w))
            })
            .unwrap_or_else(|| {
                panic!("the lesson declares no `{kind}` widget (issue 8's contract, section 1)")
            })
    }

    /// What the first widget of `kind` names, whatever its example is (a block, a gradient, …):
    /// its root's selector, page, section, `example` and `digits`.
    pub fn widget_names(&self, kind: &str) -> WidgetNames {
        let (section, block) = self.widget_block(kind);
        let field = |name: &str| block.get(name).and_then(toml::Value::as_str);
        let id = field("id").expect("a widget has an id");
        WidgetNames {
            root: format!("[data-qkv-widget=\"{kind}\"]#widget-{id}"),
            page: format!("{}.html", section.id),
            section: section.id.clone(),
            example: field("example").unwrap_or_else(|| panic!("widget {id} names no example")).to_string(),
            digits: block.get("digits").and_then(toml::Value::as_integer).unwrap_or(4) as usize,
        }
    }

    /// The first widget of `kind` in any section, with what every widget names.
    pub fn widget(&self, kind: &str) -> Widget<'_> {
        let (section, block) = self.widget_block(kind);
        let field = |name: &str| block.get(name).and_then(toml::Value::as_str);
        let id = field("id").expect("a widget has an id");
        let example = field("example").unwrap_or_else(|| panic!("widget {id} names no example"));
        Widget {
            root: format!("[data-qkv-widget=\"{kind}\"]#widget-{id}"),
            page: format!("{}.html", section.id),
            example: self.example(&section.id, example),
            digits: block.get("digits").and_then(toml::Value::as_integer).unwrap_or(4) as usize,
            block,
        }
    }

    /// A computed number by its path in `section` (`quiz_softmax.weights.1`), or already
    /// qualified (`attention.quiz_softmax.weights.1`).
    pub fn number(&self, section: &str, path: &str) -> f64 {
        let value = self
            .records
            .get(&format!("{section}.{path}"))
            .or_else(|| self.records.get(path))
            .unwrap_or_else(|| panic!("the lesson computes no number at `{path}`"));
        value.parse().unwrap_or_else(|_| panic!("`{path}` is {value}, not a number"))
    }

    /// The numbers `path.1`, `path.2`, … of `section` (a vector, such as a query by its label).
    pub fn vector(&self, section: &str, path: &str) -> Vec<f64> {
        (1..)
            .map_while(|c| self.records.get(&format!("{section}.{path}.{c}")))
            .map(|v| v.parse().unwrap_or_else(|_| panic!("`{path}` holds {v}, not a number")))
            .collect()
    }

    /// The section `id`.
    pub fn section(&self, id: &str) -> &Section {
        self.sections
            .iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("the lesson has no section `{id}`"))
    }

    /// The rows of the matrix at `path` in `section` (`many.x`, `many.w_o`), one per name in
    /// `rows` (token labels, or `1`, `2`, … for a projection's rows), each read to its last column.
    pub fn rows(&self, section: &str, path: &str, rows: &[String]) -> Vec<Vec<f64>> {
        rows.iter().map(|row| self.vector(section, &format!("{path}.{row}"))).collect()
    }

    /// The names under `path` in `section` that have an entry `leaf` (`heads` and `kv_head`
    /// give a multi-head example's head names), in the order the records list them.
    pub fn names(&self, section: &str, path: &str, leaf: &str) -> Vec<String> {
        let prefix = format!("{section}.{path}.");
        self.paths
            .iter()
            .filter_map(|k| k.strip_prefix(&prefix)?.strip_suffix(&format!(".{leaf}")))
            .filter(|name| !name.contains('.'))
            .map(str::to_string)
            .collect()
    }

    /// The attention example `id` of `section`.
    pub fn example(&self, section: &str, id: &str) -> Example {
        let prefix = format!("{section}.{id}.");
        let fields: Vec<(&str, &String)> = self
            .records
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (&k[prefix.len()..], v))
            .collect();
        assert!(!fields.is_empty(), "the lesson has no example `{section}.{id}`");
        // Tokens are listed `tokens.1`, `tokens.2`, …: sort by position, not as text.
        let mut tokens: Vec<(usize, String)> = fields
            .iter()
            .filter_map(|(k, v)| {
                Some((k.strip_prefix("tokens.")?.parse().ok()?, v.trim_matches('"').to_string()))
            })
            .collect();
        tokens.sort();
        let labels: Vec<String> = tokens.into_iter().map(|(_, t)| t).collect();
        let matrix = |name: &str| -> Vec<Vec<f64>> {
            labels
                .iter()
                .map(|label| {
                    (1..)
                        .map_while(|c| fields.iter().find(|(k, _)| *k == format!("{name}.{label}.{c}")))
                        .map(|(_, v)| v.parse().expect("a number"))
                        .collect()
                })
                .collect()
        };
        let scale = self.number(section, &format!("{id}.scale"));
        Example { queries: matrix("queries"), keys: matrix("keys"), values: matrix("values"), labels, scale }
    }
}

/// A `qkv widget` block with what every kind names.
pub struct Widget<'a> {
    /// The CSS selector of its root on the page.
    pub root: String,
    /// Its page in the site (`attention.html`).
    pub page: String,
    /// The inputs of the example it shows.
    pub example: Example,
    /// How many decimals its readouts show (default 4, like the lesson).
    pub digits: usize,
    pub block: &'a toml::Table,
}

/// An attention example's inputs, one row per token.
#[derive(Debug, Clone)]
pub struct Example {
    pub labels: Vec<String>,
    pub queries: Vec<Vec<f64>>,
    pub keys: Vec<Vec<f64>>,
    pub values: Vec<Vec<f64>>,
    pub scale: f64,
}

fn array(rows: &[Vec<f64>]) -> Array2<f64> {
    let width = rows.first().map_or(0, Vec::len);
    Array2::from_shape_vec((rows.len(), width), rows.concat()).expect("rectangular rows")
}

impl Example {
    /// The engine's f64 trace of `query` against this example's keys and values.
    pub fn trace(&self, query: &[f64]) -> QueryTrace {
        let q = array(&[query.to_vec()]);
        let (k, v) = (array(&self.keys), array(&self.values));
        qkv::trace_query(q.view(), k.view(), v.view(), 0, &AttentionOptions::new().scale(self.scale))
            .expect("the engine traces the query")
    }

    /// The engine's weights (one row per query of the example) and outputs.
    pub fn self_attention(&self) -> (Array2<f64>, Array2<f64>) {
        let (q, k, v) = (array(&self.queries), array(&self.keys), array(&self.values));
        let options = AttentionOptions::new().scale(self.scale);
        let result =
            qkv::reference::attention(q.view(), k.view(), v.view(), &options).expect("the engine evaluates");
        (result.weights.into_inner(), result.output)
    }

    /// The row of `label`.
    pub fn index(&self, label: &str) -> usize {
        self.labels.iter().position(|l| l == label).unwrap_or_else(|| panic!("no token `{label}`"))
    }
}
