//! `error EXAMPLE`: the engine's own error message for an example declared with
//! `expect_error = true`, so the lesson quotes what the engine really says.

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::Computed;

pub(super) const KIND: Kind = Kind { name: "error", usage: "`error EXAMPLE`", options: &[], generate };

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let named = cx.named(KIND.usage)?;
    match named.computed {
        Computed::Attention { result: Err(message), .. } => Ok(cx.markdown(error_block(&message))),
        _ => Err(cx.problem(
            format!("`{}` has no error to show", cx.args[0]),
            "an attention example with `expect_error = true`",
        )),
    }
}

/// The engine's error for an example declared with `expect_error = true`.
fn error_block(message: &str) -> String {
    format!("```text\nerror: {message}\n```\n")
}
