//! The NumPy laboratory as a Jupyter notebook (nbformat 4), written by hand with serde_json.

use serde_json::json;

/// A notebook with an introduction, the lab program, and its expected printout as the cell output.
pub(crate) fn notebook(title: &str, intro: &str, code: &str, printed: &str) -> String {
    let lines = |text: &str| -> Vec<String> { text.split_inclusive('\n').map(str::to_string).collect() };
    let nb = json!({
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": { "display_name": "Python 3", "language": "python", "name": "python3" },
            "language_info": { "name": "python" }
        },
        "cells": [
            {
                "cell_type": "markdown",
                "id": "intro",
                "metadata": {},
                "source": lines(&format!("# {title}\n\n{intro}\n"))
            },
            {
                "cell_type": "code",
                "id": "lab",
                "execution_count": 1,
                "metadata": {},
                "source": lines(code.trim_end()),
                "outputs": [
                    { "output_type": "stream", "name": "stdout", "text": lines(printed) }
                ]
            }
        ]
    });
    let mut text = serde_json::to_string_pretty(&nb).unwrap_or_default();
    text.push('\n');
    text
}
