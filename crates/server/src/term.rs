//! Text the CLI prints (and the MCP tools return) that others control: names and metadata, a
//! sandbox's log, a build's log, errors that quote a sandbox or a registry, another tenant's
//! template names. Control characters in it, which a terminal would act on (moving the cursor,
//! clearing the screen, retitling the window, rewriting what was printed before), are printed
//! escaped instead (`\x1b`, `\u{9b}`), whether or not the output is a terminal: it may be one
//! later (`less`, `cat` of a saved log). A command's own output (`sandbox exec`, `shell`,
//! `run`) is the user's to print raw, as a terminal of the sandbox's own would.

use std::borrow::Cow;

/// Free text (a message, an error): control characters escaped, line breaks and tabs kept.
pub fn escaped(text: &str) -> Cow<'_, str> {
    escape(text, |c| c == '\n' || c == '\t')
}

/// A table cell or a one-line field: every control character escaped, line breaks too.
pub fn cell(text: &str) -> Cow<'_, str> {
    escape(text, |_| false)
}

/// JSON as it came, with the control characters JSON lets through unescaped (DEL and the C1
/// set, which can stand only inside its strings) as `\u` escapes, so it means the same. Its
/// whitespace (line breaks, tabs) is left alone.
pub fn json(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && !matches!(c, '\n' | '\r' | '\t');
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match unsafe_char(c) {
            true => out.push_str(&format!("\\u{:04x}", c as u32)),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn escape(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && !keep(c);
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !unsafe_char(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "a\x1b]0;title\x07b\x1b[2Jc\u{9b}31md\x7fe\r\n\tf";

    #[test]
    fn control_characters_are_escaped_and_the_text_around_them_kept() {
        assert_eq!(
            escaped(HOSTILE),
            "a\\x1b]0;title\\x07b\\x1b[2Jc\\u{9b}31md\\x7fe\\r\n\tf"
        );
        assert_eq!(
            cell(HOSTILE),
            "a\\x1b]0;title\\x07b\\x1b[2Jc\\u{9b}31md\\x7fe\\r\\n\\tf"
        );
        assert!(matches!(escaped("plain, ünïcode\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_keeps_its_meaning_without_raw_controls() {
        let text = serde_json::json!({ "note": HOSTILE }).to_string();
        let safe = json(&text);
        assert!(!safe.chars().any(char::is_control), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["note"], HOSTILE);
    }
}
