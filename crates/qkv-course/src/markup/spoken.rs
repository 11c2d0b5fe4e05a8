//! MathML spoken as words, for the `aria-label` every `<math>` of the site carries: Chromium
//! leaves a `<math>`'s text out of the accessible name of what holds it, so a quiz option or a
//! table header that is a formula was announced as "(c)" or nothing. The words follow
//! MathSpeak's brief style ("p sub j", "d sub k squared", "a over b"), with the operators as
//! words (a screen reader at its default punctuation level says nothing for `=` or `−`).

/// One MathML element with its children, or a run of text.
enum Node {
    Element(String, Vec<Node>),
    Text(String),
}

/// `mathml` (one `<math>` element, as `pulldown_latex` writes it) as words.
pub(crate) fn spoken(mathml: &str) -> String {
    let words = parse(mathml).iter().map(speak).collect::<Vec<_>>().join(" ");
    let words = words.split_whitespace().collect::<Vec<_>>().join(" ");
    // Punctuation sits against its words, as it is written.
    words.replace(" ,", ",").replace("( ", "(").replace(" )", ")")
}

/// The nodes of `markup`: elements nest by their tags; attributes are dropped, entities decoded.
fn parse(markup: &str) -> Vec<Node> {
    let mut stack: Vec<(String, Vec<Node>)> = vec![(String::new(), Vec::new())];
    let mut rest = markup;
    while !rest.is_empty() {
        // pulldown_latex writes `<` and `>` as they are in an operator (`<mo><</mo>`): a `<`
        // that opens no tag is text, as a browser reads it.
        let tag =
            rest.strip_prefix('<').filter(|t| t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/'));
        let Some(tag) = tag else {
            // Past the first character, which may be such a `<`.
            let first = rest.chars().next().map_or(0, char::len_utf8);
            let end = rest[first..].find('<').map_or(rest.len(), |i| i + first);
            let text = decode(&rest[..end]);
            stack.last_mut().expect("the root").1.push(Node::Text(text));
            rest = &rest[end..];
            continue;
        };
        let end = tag.find('>').unwrap_or(tag.len());
        let inside = &tag[..end];
        rest = tag.get(end + 1..).unwrap_or("");
        if inside.starts_with('/') {
            // A closing tag ends the innermost element (pulldown_latex's output is well formed;
            // text it left unescaped, such as `\text{<b>}`, at worst gives odd words, never a
            // failed build).
            if stack.len() > 1 {
                let (open, children) = stack.pop().expect("more than the root");
                stack.last_mut().expect("the root").1.push(Node::Element(open, children));
            }
        } else {
            let name = inside.split([' ', '/']).next().unwrap_or_default().to_string();
            if inside.ends_with('/') {
                stack.last_mut().expect("the root").1.push(Node::Element(name, Vec::new()));
            } else {
                stack.push((name, Vec::new()));
            }
        }
    }
    // Elements left open (none, from pulldown_latex) keep their children.
    while stack.len() > 1 {
        let (name, children) = stack.pop().expect("more than the root");
        stack.last_mut().expect("the root").1.push(Node::Element(name, children));
    }
    stack.pop().expect("the root").1
}

/// Text with the entities `escape` and `pulldown_latex` write decoded.
fn decode(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// A node as words.
fn speak(node: &Node) -> String {
    let (name, children) = match node {
        Node::Text(text) => return text.chars().map(symbol).collect(),
        Node::Element(name, children) => (name.as_str(), children),
    };
    let part = |i: usize| children.get(i).map(speak).unwrap_or_default();
    match name {
        // A sum's index, inline or displayed, is what it runs over.
        "msub" if part(0).trim() == "sum" => format!("sum over {}", part(1)),
        "msub" => format!("{} sub {}", part(0), part(1)),
        "msup" => power(&part(0), &part(1)),
        "msubsup" => power(&format!("{} sub {}", part(0), part(1)), &part(2)),
        "munder" => format!("{} over {}", part(0), part(1)),
        "mover" => format!("{} {}", part(0), part(1)),
        "munderover" => format!("{} from {} to {}", part(0), part(1), part(2)),
        "mfrac" => format!("{} over {}", part(0), part(1)),
        "msqrt" => format!("square root of {}", children.iter().map(speak).collect::<Vec<_>>().join(" ")),
        "mroot" => format!("root {} of {}", part(1), part(0)),
        "mspace" => " ".to_string(),
        _ => children.iter().map(speak).collect::<Vec<_>>().join(" "),
    }
}

/// `base` raised to `exponent`, as said aloud.
fn power(base: &str, exponent: &str) -> String {
    match exponent.trim() {
        "2" => format!("{base} squared"),
        "T" | "transpose" => format!("{base} transpose"),
        exponent => format!("{base} to the power {exponent}"),
    }
}

/// A character of MathML text as said: operators as words (spaced), the rest as they are.
fn symbol(c: char) -> String {
    let word = match c {
        '=' => "equals",
        '≈' => "approximately equals",
        '≠' => "is not equal to",
        '<' => "is less than",
        '>' => "is greater than",
        '≤' => "is at most",
        '≥' => "is at least",
        '+' => "plus",
        '−' | '-' => "minus",
        '⋅' | '×' => "times",
        '∘' | '⊙' => "element-wise times",
        '/' => "over",
        '∑' => "sum",
        '∂' => "partial",
        '∈' => "in",
        '→' => "to",
        '←' => "gets",
        '‖' => "norm",
        '∞' => "infinity",
        '⊤' => "transpose",
        '√' => "square root of",
        // Function application (`max⁡ x`) is silent.
        '\u{2061}' => "",
        c => return c.to_string(),
    };
    format!(" {word} ")
}

#[cfg(test)]
mod tests {
    use super::spoken;
    use crate::markup::mathml;

    /// TeX as the site writes it, spoken.
    fn said(tex: &str) -> String {
        spoken(&mathml(tex, false))
    }

    #[test]
    fn formulas_are_spoken_in_words() {
        assert_eq!(said("p_j"), "p sub j");
        assert_eq!(said("k = I"), "k equals I");
        assert_eq!(said(r"\partial p_j / \partial s_k"), "partial p sub j over partial s sub k");
        assert_eq!(said(r"\frac{q \cdot k}{\sqrt{d_k}}"), "q times k over square root of d sub k");
        assert_eq!(said(r"\sigma^2 + \epsilon"), "σ squared plus ϵ");
        assert_eq!(said(r"K^\top"), "K transpose");
        assert_eq!(said(r"e^{s_i - m}"), "e to the power s sub i minus m");
        assert_eq!(said(r"\sum_j e^{s_j}"), "sum over j e to the power s sub j");
        assert_eq!(said(r"x_{\text{new}} \approx 0.5"), "x sub new approximately equals 0.5");
        assert_eq!(said(r"a < b"), "a is less than b");
        assert_eq!(said(r"m-n"), "m minus n");
        assert_eq!(said(r"e^{(0, -1)}"), "e to the power (0, minus 1)");
        // Text with markup characters in it is read without failing.
        assert!(said(r"\text{<b>} x < y").ends_with("x is less than y"));
    }
}
