use super::*;

/// How many mutants of the committed course a plain `cargo test` tries: about 0.2 s each in a
/// debug build, since each builds all six sections twice. Longer runs are
/// `cargo xtask fuzz --minutes N`, which `.ci/run` also runs, with a new seed each time.
const CASES: u64 = 24;

fn committed_lesson() -> Lesson {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    Lesson::read(&root.join("content")).expect("the committed lesson")
}

/// The promises of the build on mutants of the committed lesson (see the module's doc).
#[test]
fn the_committed_lesson_survives_mutation() {
    let base = committed_lesson();
    let work = tempfile::tempdir().expect("scratch folder");
    let started = Instant::now();
    let summary = run_cases(&base, 11, work.path(), |s| s.cases >= CASES);
    eprintln!(
        "{} mutants in {:.1} s: {} built, {} rejected",
        summary.cases,
        started.elapsed().as_secs_f64(),
        summary.built,
        summary.rejected
    );
    let report: Vec<String> = summary
        .failures
        .iter()
        .map(|(case, failure)| {
            format!(
                "case {} ({}):\n{failure}\nmake it again: Case::new(&committed_lesson(), {}, {})",
                case.index,
                case.mutations.join("; "),
                case.seed,
                case.index
            )
        })
        .collect();
    assert!(
        report.is_empty(),
        "{} of {} mutants broke a promise:\n\n{}",
        report.len(),
        summary.cases,
        report.join("\n\n")
    );
    // A run that only ever failed, or only ever passed, would test little.
    assert!(summary.built > 0 && summary.rejected > 0, "{summary:?}");
}

/// The same promises on mutants of the fixture lesson that holds every example kind (named
/// matrices, multi-head and GQA, masks, decoding, the tiled trace), which the committed lesson
/// does not use.
#[test]
fn the_every_kind_fixture_survives_mutation() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let fixture = root.join("crates/qkv-course/src/pipeline/fixtures/every-kind.md");
    let base = Lesson {
        markdown: vec![("01-every-kind.md".into(), fs::read(&fixture).expect("the fixture"))],
        figures: Vec::new(),
        data: Vec::new(),
    };
    let work = tempfile::tempdir().expect("scratch folder");
    let summary = run_cases(&base, 23, work.path(), |s| s.cases >= CASES / 2);
    let report: Vec<String> = summary
        .failures
        .iter()
        .map(|(case, failure)| format!("case {} ({}):\n{failure}", case.index, case.mutations.join("; ")))
        .collect();
    assert!(report.is_empty(), "{} mutants broke a promise:\n\n{}", report.len(), report.join("\n\n"));
    assert!(summary.built > 0 && summary.rejected > 0, "{summary:?}");
}

/// The checks themselves catch what they promise to catch.
#[test]
fn a_broken_promise_is_reported() {
    let work = tempfile::tempdir().expect("scratch folder");
    let mut lesson = committed_lesson();
    lesson.markdown[0].1 = b"# T\n\n[?](=nothing.here:2)\n".to_vec();
    assert_eq!(check_case(&lesson, work.path()), Ok(Outcome::Rejected));
    let error = qkv_course::ContentError {
        file: "content/01-attention.md".into(),
        line: 9,
        column: 1,
        message: "m".into(),
        found: String::new(),
        expected: String::new(),
    };
    let texts = ["one line\n".to_string()];
    let outside = located(std::slice::from_ref(&error), &["content/01-attention.md".into()], &texts);
    assert!(outside.is_err_and(|e| e.starts_with("an error is outside its file")));
    assert!(guarded("x", || panic!("boom")).is_err_and(|e| e.contains("x panicked") && e.contains("boom")));
    // Citation syntax in a built page, or beyond the citations of a lesson file, is found.
    let scratch = tempfile::tempdir().expect("scratch folder");
    fs::create_dir_all(scratch.path().join("site")).expect("site folder");
    fs::write(scratch.path().join("site/a.html"), "<p>{=sentence.d_k:0}</p>").expect("page");
    let found = leftovers(scratch.path(), &committed_lesson());
    assert!(found.len() == 1 && found[0].starts_with("site/a.html"), "{found:?}");
}

#[test]
fn the_same_seed_makes_the_same_mutants() {
    let base = committed_lesson();
    let (a, b) = (Case::new(&base, 5, 17), Case::new(&base, 5, 17));
    assert_eq!(a.mutations, b.mutations);
    assert_eq!(a.lesson.markdown, b.lesson.markdown);
    assert_ne!(Case::new(&base, 5, 18).mutations, a.mutations);
}
