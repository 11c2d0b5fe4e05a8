//! How numbers are shown: fixed decimals for citations, and the lesson's rule for steps
//! (exact integers bare, everything else at the lesson's precision, `≈` when rounding shows).

/// The default number of decimals in generated steps, tables, quizzes and widgets.
pub(crate) const DEFAULT_DIGITS: usize = 4;

/// What a citation's format may be, for messages about one that is not.
pub(crate) const FORMATS: &str = "a number of decimals (`:2`), then optionally `%` for a percentage (`:1%`) and `g` to print exact integers bare (`:4g`); or `:w` for the number as written (`:w%` as a percentage)";

/// From this magnitude on numbers are written in scientific notation (`1.23e35`): past 2^53 an
/// f64's integer digits are no longer all its own, and a 35-digit integer helps no reader.
pub(crate) const SCIENTIFIC_FROM: f64 = 1e16;

/// A citation's number format: `:2` is two decimals, `:1%` a percentage with one decimal, `:4g`
/// four decimals but exact integers bare (`0`, not `0.0000`), `:w` the number as written (its
/// shortest decimal form that reads back as the same f64: `0.75`, `0.5`, `2`), `:w%` that as a
/// percentage (`75%`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format {
    pub decimals: usize,
    pub percent: bool,
    pub bare_integers: bool,
    /// As written: the shortest round-trip form, `decimals` unused.
    pub shortest: bool,
}

impl Format {
    /// `decimals` decimals, exact integers bare: how steps and quiz keys show numbers.
    pub(crate) fn decimals(decimals: usize) -> Self {
        Self { decimals, percent: false, bare_integers: true, shortest: false }
    }

    /// Parses the part after the last `:` of a citation.
    pub(crate) fn parse(spec: &str) -> Option<Self> {
        match spec {
            "w" => return Some(Self { decimals: 0, percent: false, bare_integers: false, shortest: true }),
            "w%" => return Some(Self { decimals: 0, percent: true, bare_integers: false, shortest: true }),
            _ => {}
        }
        let (spec, bare_integers) = match spec.strip_suffix('g') {
            Some(d) => (d, true),
            None => (spec, false),
        };
        let (digits, percent) = match spec.strip_suffix('%') {
            Some(d) => (d, true),
            None => (spec, false),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let decimals = digits.parse().ok().filter(|&d: &usize| d <= 12)?;
        Some(Self { decimals, percent, bare_integers, shortest: false })
    }

    /// Formats `x`, which the caller has checked is finite.
    pub(crate) fn apply(self, x: f64) -> String {
        if self.shortest {
            let text = shortest(x, if self.percent { 2 } else { 0 });
            return if self.percent { format!("{text}%") } else { text };
        }
        let x = if self.percent { 100.0 * x } else { x };
        let decimals = if self.bare_integers && x == x.trunc() { 0 } else { self.decimals };
        let text = fixed(x, decimals);
        if self.percent { format!("{text}%") } else { text }
    }
}

/// `x` times `10^shift` in its shortest round-trip decimal form (`0.731` shifted by 2 is `73.1`,
/// exactly, without the float noise of multiplying first); scientific from [`SCIENTIFIC_FROM`].
pub(crate) fn shortest(x: f64, shift: i32) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0) + shift;
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if exponent >= 16 {
        let (head, tail) = digits.split_at(1);
        let point = if tail.is_empty() { String::new() } else { format!(".{tail}") };
        return format!("{sign}{head}{point}e{exponent}");
    }
    // `digits` is d.ddd × 10^exponent: place the point.
    let point = exponent + 1;
    let text = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
    };
    if text.chars().all(|c| c == '0' || c == '.') { text } else { format!("{sign}{text}") }
}

/// `x` with `decimals` decimals (in scientific notation, `decimals` in the mantissa, from
/// [`SCIENTIFIC_FROM`]); never prints a negative zero.
pub(crate) fn fixed(x: f64, decimals: usize) -> String {
    if x == f64::NEG_INFINITY {
        return "-∞".to_string();
    }
    if x == f64::INFINITY {
        return "∞".to_string();
    }
    if x.abs() >= SCIENTIFIC_FROM {
        return format!("{x:.decimals$e}");
    }
    let s = format!("{x:.decimals$}");
    if s.starts_with('-') && s[1..].bytes().all(|b| b == b'0' || b == b'.') { s[1..].to_string() } else { s }
}

/// A number as TeX writes it: `1.2e35` as `1.2 \times 10^{35}`, `∞` as `\infty`, a `%` escaped
/// (in TeX it starts a comment).
pub(crate) fn tex_number(text: &str) -> String {
    let text = text.replace('∞', r"\infty").replace('%', r"\%");
    match text.split_once('e') {
        Some((mantissa, exponent)) if exponent.parse::<i32>().is_ok() => {
            format!(r"{mantissa} \times 10^{{{exponent}}}")
        }
        _ => text,
    }
}

/// A number shown in worked steps: exact integers bare (`1`, `6`), others at `digits` decimals.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    /// The text as printed.
    pub text: String,
    /// The printed value, in units of `10^-digits` (for exact sums of shown terms); `None` when it
    /// is too large to count exactly (beyond 2^100 units), so no sum of it is ever called exact.
    pub units: Option<i128>,
    /// Whether the printed text is the value exactly.
    pub exact: bool,
}

/// Shows `x` at `digits` decimals following the lesson's rule.
pub(crate) fn shown(x: f64, digits: usize) -> Shown {
    let scale = 10f64.powi(digits as i32);
    if !x.is_finite() {
        return Shown { text: fixed(x, 0), units: None, exact: true };
    }
    if x == x.trunc() && x.abs() < 1e15 {
        // Below 1e15 an integer times 10^12 (the most digits allowed) still fits an i128 exactly.
        return Shown { units: Some(x as i128 * 10i128.pow(digits as u32)), text: fixed(x, 0), exact: true };
    }
    let text = fixed(x, digits);
    let value: f64 = text.parse().unwrap_or(x);
    let exact = value == x;
    // An exact decimal reads best without padding: 0.5, not 0.5000, and 1e20, not 1.0000e20.
    let text = if exact && text.contains('.') {
        let (mantissa, exponent) = text.split_once('e').map_or((text.as_str(), None), |(m, e)| (m, Some(e)));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        exponent.map_or_else(|| mantissa.to_string(), |e| format!("{mantissa}e{e}"))
    } else {
        text
    };
    // Counting units is exact only while they fit an f64 mantissa's reach; past 2^100 (a value
    // near 1e26 at four decimals) the sum could overflow or round, so it is never called exact.
    let scaled = (value * scale).round();
    let units = (scaled.abs() < 2f64.powi(100)).then_some(scaled as i128);
    Shown { units, exact, text }
}

/// The relation to print between an expression of shown operands and a shown result:
/// `=` only when the printed equation is true of the printed numbers.
pub(crate) fn relation(exact: bool) -> &'static str {
    if exact { "=" } else { r"\approx" }
}

/// `=` when the shown terms add up exactly to the shown total and nothing was rounded.
pub(crate) fn sum_relation(terms: &[Shown], total: &Shown) -> &'static str {
    // Checked: at most 2^100 per term, but a lesson may add many of them.
    let sum = terms.iter().try_fold(0i128, |sum, t| sum.checked_add(t.units?));
    relation(sum.is_some() && sum == total.units && terms.iter().all(|t| t.exact) && total.exact)
}

#[cfg(test)]
mod tests;
