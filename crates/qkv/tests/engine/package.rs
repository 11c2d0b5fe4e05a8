//! The crate as `cargo package` ships it: what the sources include lies inside the package, and
//! the licence files the manifest's `MIT OR Apache-2.0` promises are there.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

#[test]
fn included_files_and_licences_are_inside_the_package() {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).canonicalize().unwrap();
    for file in sources(&package.join("src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for included in text.split("include_str!(\"").skip(1).filter_map(|rest| rest.split('"').next()) {
            let path = file.parent().unwrap().join(included);
            let resolved =
                path.canonicalize().unwrap_or_else(|e| panic!("{}: {included}: {e}", file.display()));
            assert!(
                resolved.starts_with(&package),
                "{} includes {included}, outside the package: the packaged crate would not build",
                file.display()
            );
        }
    }
    for licence in ["LICENSE-MIT", "LICENSE-APACHE"] {
        assert!(package.join(licence).is_file(), "{licence} is missing from the package");
    }
}
