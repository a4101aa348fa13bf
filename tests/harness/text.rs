//! Reading processes' logs as text.

/// `line` without its terminal escape sequences (`ESC [ … m` colours, and any other that ends
/// with a letter): a process's log read as text.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::strip_ansi;

    #[test]
    fn escape_sequences_are_stripped_and_the_text_kept() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2026-12-02T10:00:00Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m bound"),
            "2026-12-02T10:00:00Z  INFO bound"
        );
        assert_eq!(strip_ansi("\u{1b}[1;31mERROR\u{1b}[K x"), "ERROR x");
        assert_eq!(strip_ansi("plain"), "plain");
    }
}
