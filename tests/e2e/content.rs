//! The lesson pipeline end to end: `cargo xtask build-content` on the committed lesson and on
//! edited copies of it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{numpy_available, python_modules_available, xtask};

pub(crate) fn content_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").join("content")
}

/// A copy of `content/` in a fresh temporary folder.
pub(crate) fn copy_of_content() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_dir(&content_dir(), &dir.path().join("content"));
    dir
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create dir");
    for entry in fs::read_dir(from).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            fs::copy(&path, to.join(entry.file_name())).expect("copy file");
        }
    }
}

/// Every file under `dir` with its bytes, for "nothing was written" comparisons.
pub(crate) fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(snapshot(&path));
        } else {
            out.push((path.clone(), fs::read(&path).expect("read file")));
        }
    }
    out.sort();
    out
}

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// rust-analyzer's "generated file is stale → test fails": a plain `cargo test` runs the check.
#[test]
fn committed_lesson_is_up_to_date() {
    let run = xtask(&["build-content", "--check"]);
    assert_eq!(run.status, 0, "the committed lesson is stale or broken:\n{}", run.stderr);
}

#[test]
fn changing_v_love_is_caught_by_check_and_fixed_by_one_build() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    let out = dir.path().join("site");
    let lesson = content.join("01-attention.md");
    let text = fs::read_to_string(&lesson).expect("lesson");
    let edited = text.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1);
    assert_ne!(text, edited, "the lesson declares v_love = 6");
    fs::write(&lesson, &edited).expect("write");

    let check = xtask(&["build-content", "--check", "--content", arg(&content)]);
    assert_eq!(check.status, 1, "{}", check.stderr);
    assert!(check.stderr.contains("01-attention.md:"), "{}", check.stderr);
    assert!(
        check.stderr.contains("expected 4.01, found 4.41 (citation sentence.love.output)"),
        "{}",
        check.stderr
    );
    assert!(check.stderr.contains("(steps sentence.love)"), "{}", check.stderr);
    assert!(check.stderr.contains("(figure love-sweep)"), "{}", check.stderr);
    assert!(check.stderr.contains("run `cargo xtask build-content`"), "{}", check.stderr);

    let build = xtask(&["build-content", "--content", arg(&content), "--out", arg(&out)]);
    assert_eq!(build.status, 0, "{}", build.stderr);
    let again = xtask(&["build-content", "--check", "--content", arg(&content)]);
    assert_eq!(again.status, 0, "{}", again.stderr);

    let rebuilt = fs::read_to_string(&lesson).expect("lesson");
    assert!(rebuilt.contains("**[4.01](=sentence.love.output:2)**"), "prose");
    assert!(rebuilt.contains(r"\approx 4.0056$"), "worked steps");
    assert!(rebuilt.contains("| love | (0, 1) | (0, 1) | 5 |"), "inputs table");
    assert!(rebuilt.contains("| **love** | 0.1978 | 0.4011 | 0.4011 | 1.0000 | 4.0056 |"), "weights table");
    assert!(rebuilt.contains("output:  4.0056"), "laboratory printout");
    let sweep = fs::read_to_string(content.join("figures/love-sweep.svg")).expect("figure");
    assert!(sweep.contains("output 4.01"), "figure marker");
    let page = fs::read_to_string(out.join("attention.html")).expect("page");
    assert!(page.contains(">4.01</span>"), "page");
    assert!(!page.contains(">4.41</span>"), "no stale output left on the page");
    let masked = fs::read_to_string(content.join("02-causal-masking.md")).expect("section 2");
    assert!(masked.contains("[4.01](=attention.sentence.love.output:2)"), "cross-section citation");
}

#[test]
fn a_second_build_changes_nothing() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    let before = snapshot(&content);
    let build = xtask(&["build-content", "--content", arg(&content), "--out", arg(&dir.path().join("site"))]);
    assert_eq!(build.status, 0, "{}", build.stderr);
    assert!(build.stdout.contains("0 files rewritten, 0 figures re-rendered"), "{}", build.stdout);
    assert_eq!(before, snapshot(&content));
    for page in [
        "index.html",
        "attention.html",
        "causal-masking.html",
        "print.html",
        "search-index.js",
        "style.css",
        "figures/love-sweep.svg",
        "figures/love-sweep.png",
    ] {
        assert!(dir.path().join("site").join(page).is_file(), "{page} missing from the site");
    }
}

#[test]
fn bad_content_fails_with_a_position_and_writes_nothing() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    let lesson = content.join("01-attention.md");
    let text = fs::read_to_string(&lesson).expect("lesson");
    // A stale number (would be rewritten) and a misspelt reference (an error) in the same run.
    let broken = text.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1).replacen(
        "(=sentence.I.output:2)",
        "(=sentence.I.outptu:2)",
        1,
    );
    fs::write(&lesson, &broken).expect("write");
    let before = snapshot(&content);
    let out = dir.path().join("site");
    let build = xtask(&["build-content", "--content", arg(&content), "--out", arg(&out)]);
    assert_eq!(build.status, 1, "{}", build.stderr);
    assert!(build.stderr.contains("01-attention.md:"), "{}", build.stderr);
    assert!(build.stderr.contains("unknown reference `sentence.I.outptu`"), "{}", build.stderr);
    assert!(build.stderr.contains("nothing was written"), "{}", build.stderr);
    assert_eq!(before, snapshot(&content), "the author's files were touched");
    assert!(!out.exists(), "a failed build wrote the site");
}

#[test]
fn the_notebook_prints_what_the_lesson_says() {
    let dir = copy_of_content();
    let out = dir.path().join("site");
    let build = xtask(&["build-content", "--content", arg(&dir.path().join("content")), "--out", arg(&out)]);
    assert_eq!(build.status, 0, "{}", build.stderr);
    let text = fs::read_to_string(out.join("notebooks/attention-sentence-love.ipynb")).expect("notebook");
    let nb: serde_json::Value = serde_json::from_str(&text).expect("notebook is JSON");
    assert_eq!(nb["nbformat"], 4);
    let cell = &nb["cells"][1];
    let join = |v: &serde_json::Value| {
        v.as_array().expect("lines").iter().filter_map(|l| l.as_str()).collect::<String>()
    };
    let code = join(&cell["source"]);
    let expected = join(&cell["outputs"][0]["text"]);
    assert!(expected.contains("output:  4.4067"), "{expected}");
    if !numpy_available("the_notebook_prints_what_the_lesson_says") {
        return;
    }
    let run = Command::new("python3").args(["-c", &code]).output().expect("python3 runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(String::from_utf8_lossy(&run.stdout), expected);
    // The file itself must be a valid nbformat 4 notebook, when nbformat is there to say so.
    let path = out.join("notebooks/attention-sentence-love.ipynb");
    let validate = "import sys, nbformat; nbformat.validate(nbformat.read(sys.argv[1], as_version=4))";
    let has_nbformat =
        Command::new("python3").args(["-c", "import nbformat"]).output().is_ok_and(|o| o.status.success());
    if has_nbformat {
        let check =
            Command::new("python3").args(["-c", validate, arg(&path)]).output().expect("python3 runs");
        assert!(check.status.success(), "invalid notebook: {}", String::from_utf8_lossy(&check.stderr));
    } else {
        eprintln!(
            "the_notebook_prints_what_the_lesson_says: nbformat is not installed; notebook schema not validated"
        );
    }
}

#[test]
fn a_leftover_figure_is_reported_and_removed() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    fs::write(content.join("figures/old-figure.svg"), "<svg/>").expect("write");
    let check = xtask(&["build-content", "--check", "--content", arg(&content)]);
    assert_eq!(check.status, 1, "{}", check.stderr);
    assert!(check.stderr.contains("figures/old-figure.svg:1: expected no file"), "{}", check.stderr);
    let build = xtask(&["build-content", "--content", arg(&content), "--out", arg(&dir.path().join("site"))]);
    assert_eq!(build.status, 0, "{}", build.stderr);
    assert!(!content.join("figures/old-figure.svg").exists());
    assert!(!dir.path().join("site/figures/old-figure.svg").exists());
}

#[test]
fn a_renamed_section_leaves_no_stale_page_in_the_site_and_the_authors_files_stay() {
    let dir = copy_of_content();
    let (content, site) = (dir.path().join("content"), dir.path().join("site"));
    let build = || xtask(&["build-content", "--content", arg(&content), "--out", arg(&site)]);
    assert_eq!(build().status, 0);
    fs::write(site.join("notes.txt"), "the author's own").expect("write");
    fs::rename(content.join("09-training-attention.md"), content.join("09-training.md")).expect("rename");
    let second = build();
    assert_eq!(second.status, 0, "{}", second.stderr);
    assert!(
        second
            .stdout
            .contains("removed training-attention.html from the site: this build no longer writes it"),
        "{}",
        second.stdout
    );
    for gone in ["training-attention.html", "markdown/09-training-attention.md"] {
        assert!(!site.join(gone).exists(), "{gone} stayed in the site");
    }
    assert!(site.join("training.html").is_file());
    assert!(site.join("notes.txt").is_file(), "a file the build never wrote was removed");
}

#[test]
fn a_lesson_gone_back_to_an_earlier_input_gets_its_figure_drawn_again() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    let (lesson, svg) = (content.join("01-attention.md"), content.join("figures/sentence-heatmap.svg"));
    let (text, committed) = (fs::read_to_string(&lesson).expect("lesson"), fs::read(&svg).expect("svg"));
    let build =
        || xtask(&["build-content", "--content", arg(&content), "--out", arg(&dir.path().join("site"))]);
    // The heatmap outlines another row, and the lesson then goes back (`git checkout` of the
    // markdown alone): the file still holds the other drawing.
    let outlined = "id = \"sentence-heatmap\"\nkind = \"heatmap\"\nexample = \"sentence\"\nquery = \"love\"";
    assert!(text.contains(outlined));
    fs::write(&lesson, text.replacen(outlined, &outlined.replace("\"love\"", "\"NLP\""), 1)).expect("write");
    assert_eq!(build().status, 0);
    assert_ne!(fs::read(&svg).expect("svg"), committed);
    fs::write(&lesson, &text).expect("write");
    let check = xtask(&["build-content", "--check", "--content", arg(&content)]);
    assert_eq!(check.status, 1, "{}", check.stderr);
    assert!(
        check
            .stderr
            .contains("figures/sentence-heatmap.svg:1: expected the figure drawn from the lesson's inputs")
    );
    let again = build();
    assert!(again.stdout.contains("1 figure re-rendered"), "{}", again.stdout);
    assert_eq!(fs::read(&svg).expect("svg"), committed);
}

/// Every path under `dir` that is a leftover temporary file.
fn temporary_files(dir: &Path) -> Vec<PathBuf> {
    snapshot(dir).into_iter().map(|(p, _)| p).filter(|p| p.to_string_lossy().ends_with(".tmp")).collect()
}

/// Issue 11, finding 2: a second file with the same section id overwrote `attention.html`,
/// then failed, leaving 19 `.tmp` files; `--check` called the lesson up to date.
#[test]
fn a_duplicate_section_id_is_a_content_error_and_writes_nothing() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    let out = dir.path().join("site");
    let first = xtask(&["build-content", "--content", arg(&content), "--out", arg(&out)]);
    assert_eq!(first.status, 0, "{}", first.stderr);
    fs::copy(content.join("01-attention.md"), content.join("03-attention.md")).expect("copy");
    let (content_before, site_before) = (snapshot(&content), snapshot(&out));
    for args in [&["build-content"][..], &["build-content", "--check"][..]] {
        let run = xtask(&[args, &["--content", arg(&content), "--out", arg(&out)]].concat());
        assert_eq!(run.status, 1, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("03-attention.md:1:1: section id `attention` is also the id of "),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("01-attention.md: both would be written to attention.html"),
            "{}",
            run.stderr
        );
        assert_eq!(content_before, snapshot(&content), "{args:?} touched the lesson");
        assert_eq!(site_before, snapshot(&out), "{args:?} touched the site");
    }
}

/// A failure while writing (here a folder where a page goes) removes every temporary file and
/// renames nothing.
#[test]
fn a_failed_write_leaves_no_temporary_files() {
    let dir = copy_of_content();
    let content = dir.path().join("content");
    let out = dir.path().join("site");
    fs::create_dir_all(out.join("causal-masking.html")).expect("folder in the way");
    let lesson = content.join("01-attention.md");
    let text = fs::read_to_string(&lesson).expect("lesson");
    fs::write(&lesson, text.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1))
        .expect("write");
    let (content_before, site_before) = (snapshot(&content), snapshot(&out));
    let run = xtask(&["build-content", "--content", arg(&content), "--out", arg(&out)]);
    assert_eq!(run.status, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("causal-masking.html: a folder of that name is in the way"),
        "{}",
        run.stderr
    );
    assert_eq!(temporary_files(dir.path()), Vec::<PathBuf>::new());
    assert_eq!(content_before, snapshot(&content), "the lesson was rewritten");
    assert_eq!(site_before, snapshot(&out), "part of the site was written");
}

/// Issue 11, finding 8: the workspace comes from the run-time `CARGO_MANIFEST_DIR` (what
/// `cargo run` sets), so a binary compiled in another clone still reads this clone's lesson.
#[test]
fn the_workspace_is_found_at_run_time() {
    let dir = copy_of_content();
    fs::create_dir_all(dir.path().join("xtask")).expect("xtask folder");
    let lesson = dir.path().join("content/01-attention.md");
    let text = fs::read_to_string(&lesson).expect("lesson");
    fs::write(&lesson, text.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1))
        .expect("write");
    let run = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["build-content", "--check"])
        .env("CARGO_MANIFEST_DIR", dir.path().join("xtask"))
        .output()
        .expect("xtask runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    // Paths are shown relative to the workspace it found: the copy, not this clone.
    assert!(stderr.contains("content/01-attention.md:"), "{stderr}");
    assert!(!stderr.contains(&dir.path().display().to_string()), "{stderr}");
    assert!(stderr.contains("expected 4.01, found 4.41"), "{stderr}");
}

/// Runs each notebook named on the command line in a Jupyter kernel (nbclient) and prints what
/// its code cells printed, each notebook's printout after a line `\x1eNAME` (a record separator,
/// which no printout holds).
const RUN_NOTEBOOKS: &str = r#"
import os, sys, nbformat
from nbclient import NotebookClient
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    sys.stdout.write("\x1e" + os.path.basename(path) + "\n")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                sys.stdout.write(out["text"])
"#;

/// The text of every `<pre><code class="language-text">` block that follows an "It prints:" on a
/// page: the printouts of its labs, as the page shows them.
fn printouts(page: &str) -> Vec<String> {
    const OPEN: &str = "<code class=\"language-text\">";
    page.split("It prints:")
        .skip(1)
        .map(|rest| {
            let start = rest.find(OPEN).expect("a printout") + OPEN.len();
            let text = &rest[start..start + rest[start..].find("</code>").expect("closed")];
            text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&")
        })
        .collect()
}

/// Every lab of the course, run as the learner runs it: each notebook the build writes executes
/// in a Jupyter kernel and prints exactly what one of the pages says it prints, and every lab a
/// page shows has its notebook.
#[test]
fn every_notebook_runs_in_jupyter_and_prints_what_its_page_shows() {
    let test = "every_notebook_runs_in_jupyter_and_prints_what_its_page_shows";
    if !python_modules_available(test, &["numpy", "nbclient", "ipykernel"]) {
        return;
    }
    let dir = copy_of_content();
    let out = dir.path().join("site");
    let build = xtask(&["build-content", "--content", arg(&dir.path().join("content")), "--out", arg(&out)]);
    assert_eq!(build.status, 0, "{}", build.stderr);
    let mut notebooks: Vec<PathBuf> = fs::read_dir(out.join("notebooks"))
        .expect("notebooks")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "ipynb"))
        .collect();
    notebooks.sort();
    let mut shown: Vec<String> = Vec::new();
    for entry in fs::read_dir(&out).expect("site") {
        let path = entry.expect("entry").path();
        // The print view shows every section's labs again.
        if path.extension().is_some_and(|x| x == "html") && !path.ends_with("print.html") {
            shown.extend(printouts(&fs::read_to_string(&path).expect("page")));
        }
    }
    assert_eq!(notebooks.len(), shown.len(), "one notebook per lab on the pages");
    let run =
        Command::new("python3").arg("-c").arg(RUN_NOTEBOOKS).args(&notebooks).output().expect("python3 runs");
    assert!(run.status.success(), "a notebook failed: {}", String::from_utf8_lossy(&run.stderr));
    let printed = String::from_utf8(run.stdout).expect("utf-8");
    for one in printed.split('\u{1e}').skip(1) {
        let (name, text) = one.split_once('\n').expect("a name line");
        assert!(shown.iter().any(|s| s == text), "{name} printed\n{text}\nwhich no page shows: {shown:#?}");
    }
    assert_eq!(printed.matches('\u{1e}').count(), notebooks.len(), "{printed}");
    // The full value and the number as the prose rounds it, side by side, as on the page.
    assert!(printed.contains("output:  4.4067 (the lesson rounds it to 4.41)"), "{printed}");
    let page = fs::read_to_string(out.join("attention.html")).expect("page");
    assert!(page.contains(">4.41</span>") && page.contains(">4.4067</span>"), "the prose cites both");
}

/// NumPy's own computation of the fixture lesson's cited numbers: multi-head with `W_o`, GQA
/// under a causal mask with ALiBi, every mask kind, decoding, the tiled trace's output, and a
/// Transformer block in both orders (NumPy's own mean and variance for the layer norms), and
/// gradients under a causal mask with ALiBi, their descent and a logsumexp; RoPE (as complex
/// multiplication) and sinusoidal encodings.
const EVERY_KIND_NUMPY: &str = r#"
import numpy as np
def softmax_rows(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True)); return e / e.sum(axis=-1, keepdims=True)
def attend(Q, K, V, visible=None, bias=None):
    s = Q @ K.T / np.sqrt(K.shape[1])
    if bias is not None: s = s + bias
    if visible is not None: s = np.where(visible, s, -np.inf)
    w = softmax_rows(s); return w, w @ V
X = np.array([[1,0,1,0],[0,1,0,1],[1,1,0,0]], float)
tok = ["I", "love", "NLP"]
out = {"emb.love.1": X[1, 0]}
near = [np.array(m, float) for m in ([[1,0],[0,1],[1,0],[0,1]], [[1,0],[0,1],[0,0],[1,1]], [[1,0],[0,1],[1,1],[0,0]])]
far = [np.array(m, float) for m in ([[0,1],[1,0],[0,0],[1,1]], [[1,1],[0,1],[1,0],[0,0]], [[0,1],[1,0],[0,0],[1,1]])]
heads = [attend(X @ wq, X @ wk, X @ wv) for wq, wk, wv in (near, far)]
out["two.heads.near.love.weights.NLP"] = heads[0][0][1, 2]
o = np.hstack([h[1] for h in heads]) @ np.array([[1,0],[0,1],[1,1],[0.5,-0.5]])
out["two.output.love.1"], out["two.output.love.2"] = o[1]
causal = np.tril(np.ones((3, 3), bool))
wq = [[[1,0],[0,1],[0,0],[1,0]], [[0,1],[1,0],[1,0],[0,0]], [[1,1],[0,0],[0,1],[1,0]], [[0,0],[1,1],[1,0],[0,1]]]
kv = [([[1,0],[0,1],[1,1],[0,0]], [[1],[2],[0],[1]]), ([[0,1],[1,0],[0,0],[1,1]], [[0],[1],[3],[1]])]
slopes, share = [0.5, 0.25, 0, 0], [0, 0, 1, 1]
distance = np.arange(3)[None, :] - np.arange(3)[:, None]
g = [attend(X @ np.array(wq[h], float), X @ np.array(kv[share[h]][0], float), X @ np.array(kv[share[h]][1], float), causal, slopes[h] * distance) for h in range(4)]
out["gqa.heads.3.kv_head"] = 2
out["gqa.heads.1.love.weights.NLP"] = g[0][0][1, 2]
Q4 = np.array([[1,0],[0,1],[1,1],[2,1]], float); K4 = np.array([[1,0],[0,1],[1,1],[1,-1]], float); V4 = np.array([[2],[6],[4],[8]], float)
d4 = np.arange(4)[None, :] - np.arange(4)[:, None]
out["windowed.c.weights.b"] = attend(Q4, K4, V4, (d4 <= 0) & (d4 >= -1))[0][2, 1]
out["alibi.d.bias.a"] = 0.5 * (0 - 3)
S = np.array([[1,0],[0,1],[1,1]], float)
w, o = attend(S, S, np.array([[2],[6],[4]], float), causal)
out["gen.NLP.cache_length"] = 3
out["gen.NLP.weights.love"], out["gen.NLP.output"] = w[2, 1], o[2, 0]
w, o = attend(Q4[3:4], K4, V4)
out["flash.output"] = o[0, 0]
s = K4 @ Q4[3] / np.sqrt(2)
out["flash.blocks.1.max"] = s[:3].max()
out["flash.blocks.2.rescale"] = np.exp(s[:3].max() - max(s[:3].max(), s[3]))
Xb = np.array([[1,0,2,-1],[0,1,-1,0],[1,1,0.5,0]], float)
Wk = np.array([[1,0],[0,1],[0,0],[1,1]], float); Wv = np.array([[1,0],[0,1],[1,1],[0,0]], float)
Wq = [np.array([[1,0],[0,1],[1,0],[0,1]], float), np.array([[0,1],[1,0],[0,0],[1,1]], float)]
Wo = np.array([[1,0,0,0.5],[0,1,0.5,0],[0,0,1,0],[-0.5,0,0,1]], float)
W1 = np.array([[1,0,-1],[0,1,0],[-1,0,1],[0.5,-1,0]], float); b1 = np.array([0,0.5,-0.5])
W2 = np.array([[0.5,0,0,-1],[0,0.5,1,0],[-0.5,0,0.5,0]], float); b2 = np.array([0.25,0,0,-0.25])
def ln(H): return (H - H.mean(1, keepdims=True)) / np.sqrt(H.var(1, keepdims=True) + 0.001)
def mha(H): return np.hstack([attend(H @ q, H @ Wk, H @ Wv)[1] for q in Wq]) @ Wo
def hidden(H): return H @ W1 + b1
def ffn(H): return np.maximum(hidden(H), 0) @ W2 + b2
H = Xb + mha(ln(Xb)); pre = H + ffn(ln(H))
Hp = ln(Xb + mha(Xb)); post = ln(Hp + ffn(Hp))
out["blk.pre.love.output.1"], out["blk.pre.love.output.4"] = pre[1, 0], pre[1, 3]
out["blk.pre.love.norm1.variance"] = Xb[1].var()
out["blk.post.NLP.output.1"], out["blk.post.NLP.output.3"] = post[2, 0], post[2, 2]
out["blk.post.NLP.hidden.3"] = hidden(Hp)[2, 2]
params = sum(w.size for w in Wq + [Wk, Wv, Wo, W1, b1, W2, b2]) + 2 * 2 * 4
out["blk.params.total"] = params
out["blk.flops.total"] = 2 * sum(w.size for w in Wq + [Wk, Wv, Wo, W1, W2]) + 2 * 2 * 3 * (2 + 2)
def backward(Q, K, V, T, visible=None, bias=None):  # NumPy's own backward, from the weights
    P, O = attend(Q, K, V, visible, bias); dO = O - T
    dP = dO @ V.T; delta = (P * dP).sum(1, keepdims=True); dS = P * (dP - delta)
    return dS @ K / np.sqrt(K.shape[1]), dS.T @ Q / np.sqrt(K.shape[1]), P.T @ dO, 0.5 * (dO ** 2).sum(), delta, dS
mask, bias4 = (d4 <= 0), 0.5 * d4
T = np.array([[1],[5],[3],[6]], float)
dQ, dK, dV, L, delta, dS = backward(Q4, K4, V4, T, mask, bias4)
out["g_alibi.d_queries.c.2"], out["g_alibi.d_keys.a.1"], out["g_alibi.d_values.b.1"] = dQ[2, 1], dK[0, 0], dV[1, 0]
out["g_alibi.d.delta"], out["g_alibi.d.ds.a"], out["g_alibi.loss"] = delta[3, 0], dS[3, 0], L
q, k, v = Q4, K4, V4
for _ in range(2):
    dq, dk, dv, _, _, _ = backward(q, k, v, T, mask, bias4); q, k, v = q - 0.1 * dq, k - 0.1 * dk, v - 0.1 * dv
out["g_alibi.steps.2.loss"] = backward(q, k, v, T, mask, bias4)[3]
S4 = Q4 @ K4.T / np.sqrt(2)
out["g_four.lse.b"] = np.log(np.exp(S4[1]).sum())
T4 = np.array([[3],[5],[4],[7]], float)
dq, dk, dv, _, _, _ = backward(Q4, K4, V4, T4)
out["g_four.loss_after"] = backward(Q4 - 0.5 * dq, K4 - 0.5 * dk, V4 - 0.5 * dv, T4)[3]
out["g_four.drop"] = backward(Q4, K4, V4, T4)[3] - out["g_four.loss_after"]
out["g_four.first_order_drop"] = 0.5 * sum((g ** 2).sum() for g in (dq, dk, dv))
Qw = np.array([[1,0,2,-1],[0,1,-1,0.5],[1,1,0.5,0]], float); Kw = np.array([[0.5,1,0,-1],[1,0,1,1],[-1,2,0,0.5]], float)
Vw = np.array([[2,0],[6,1],[4,-1]], float)
theta = 100.0 ** (-np.arange(0, 4, 2) / 4)
def rope(x, m):  # each pair as a complex number, turned by e^{i m theta}
    z = (x[0::2] + 1j * x[1::2]) * np.exp(1j * m * theta); out = np.empty(4); out[0::2], out[1::2] = z.real, z.imag; return out
def pe(m):
    out = np.empty(4); out[0::2], out[1::2] = np.sin(m * theta), np.cos(m * theta); return out
w, o = attend(np.array([rope(q, i) for i, q in enumerate(Qw)]), np.array([rope(k, j) for j, k in enumerate(Kw)]), Vw)
out["rot.rope.c.weights.a"], out["rot.rope.c.output.1"] = w[2, 0], o[2, 0]
out["rot.sweep.1.rope_score"] = rope(Qw[2], 1) @ rope(Kw[0], 0) / 2
out["rot.sweep.4.rope_score"] = rope(Qw[2], 4) @ rope(Kw[0], 3) / 2
out["rot.sweep.2.sinusoid_score"] = (Qw[2] + pe(2)) @ (Kw[0] + pe(1)) / 2
out["rot.theta.2"], out["rot.encoding.3.1"], out["rot.encoding.3.4"] = theta[1], pe(3)[0], pe(3)[3]
for k, v in out.items(): print(k, repr(float(v)))
"#;

/// The fixture lesson of every example kind, built by the real command: each number it cites
/// equals NumPy's, to the digits it shows.
#[test]
fn the_every_kind_fixture_cites_what_numpy_computes() {
    let dir = tempfile::tempdir().expect("scratch");
    let content = dir.path().join("content");
    fs::create_dir_all(&content).expect("content folder");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/qkv-course/src/pipeline/fixtures/every-kind.md");
    fs::copy(&fixture, content.join("01-every-kind.md")).expect("fixture");
    let out = dir.path().join("site");
    let build = xtask(&["build-content", "--content", arg(&content), "--out", arg(&out)]);
    assert_eq!(build.status, 0, "{}", build.stderr);
    let markdown = fs::read_to_string(content.join("01-every-kind.md")).expect("built fixture");
    // Every citation `[TEXT](=PATH:DIGITS)` of the built fixture, by path.
    let mut cited = std::collections::HashMap::new();
    for (at, _) in markdown.match_indices("](=") {
        let text = &markdown[markdown[..at].rfind('[').expect("opening bracket") + 1..at];
        let rest = &markdown[at + 3..];
        let (path, format) =
            rest[..rest.find(')').expect("closing parenthesis")].rsplit_once(':').expect("format");
        cited.insert(path.to_string(), (text.to_string(), format.parse::<i32>().expect("decimals")));
    }
    if !numpy_available("the_every_kind_fixture_cites_what_numpy_computes") {
        return;
    }
    let run = Command::new("python3").args(["-c", EVERY_KIND_NUMPY]).output().expect("python3 runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let numpy = String::from_utf8_lossy(&run.stdout);
    let mut compared = 0;
    for line in numpy.lines() {
        let (path, value) = line.split_once(' ').expect("path value");
        let value: f64 = value.parse().expect("a number");
        let (text, digits) = cited.get(path).unwrap_or_else(|| panic!("the fixture does not cite {path}"));
        let shown: f64 = text.parse().unwrap_or_else(|_| panic!("{path}: `{text}` is not a number"));
        assert!(
            (shown - value).abs() <= 0.5 * 10f64.powi(-digits) + 1e-12,
            "{path}: the page shows {text}, NumPy {value}"
        );
        compared += 1;
    }
    assert_eq!(compared, cited.len(), "every citation of the fixture is compared: {cited:?}");
    // And each laboratory prints what its notebook says it prints.
    for entry in fs::read_dir(out.join("notebooks")).expect("notebooks") {
        let nb: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(entry.expect("entry").path()).expect("notebook"))
                .expect("JSON");
        let join = |v: &serde_json::Value| {
            v.as_array().expect("lines").iter().filter_map(|l| l.as_str()).collect::<String>()
        };
        let (code, expected) = (join(&nb["cells"][1]["source"]), join(&nb["cells"][1]["outputs"][0]["text"]));
        let run = Command::new("python3").args(["-c", &code]).output().expect("python3 runs");
        assert_eq!(String::from_utf8_lossy(&run.stdout), expected, "{code}");
    }
}
