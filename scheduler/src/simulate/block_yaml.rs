//! A fast reader for the block-style YAML that `kubectl get -o yaml` (go-yaml) and
//! serde-saphyr's own serializer write: a `serde::Deserializer` driven by the same typed
//! decoding as serde-saphyr, for the subset only. Anything else (anchors, aliases, tags, flow
//! collections with content, complex keys, directives, tabs, comments after values, …) is
//! refused as [`BlockYamlError::Read`], and the caller reads the text again with serde-saphyr,
//! so results, errors and edge cases stay serde-saphyr's.
//!
//! Why hand-written: serde-saphyr reads a 5,000-node dump at about 6 MiB/s. The other
//! maintained Rust YAML crates were measured on that dump: serde_yaml_ng takes 5.2 s and 1 GB
//! (it buffers every event), serde_norway 7.7 s; serde_json reads the same objects as JSON in
//! 0.09 s. No faster maintained Rust YAML parser exists (ryml is GPL C++ bindings, alpha).
//!
//! Scalars resolve by serde-saphyr's rules with its default options (YAML 1.1 booleans,
//! `0x`/`0o`/`0b` integers with `_`, non-finite floats refused where no type is asked for),
//! and duplicate keys, merge keys and integer keys are left to serde-saphyr.
//!
//! Size (~1,320 lines of code): one module on purpose. The `Parser` (its position, depth and the
//! keys of the mappings being read) is the deserializer's state: every `deserialize_*` call of
//! `NodeDe`, `BlockMap` and `BlockSeq` advances it, so the scanner, the scalar rules and the serde
//! traits that drive them are one machine. Its tests live apart, in `block_yaml/tests.rs`.

use std::{borrow::Cow, collections::HashSet, fmt};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why the text was not read.
#[derive(Debug, thiserror::Error)]
pub enum BlockYamlError {
    /// The text holds a construct outside the subset read here (or is not valid YAML).
    #[error("line {line}: {construct} is outside the subset of YAML read here")]
    Read {
        /// 1-based line.
        line: usize,
        /// What was met.
        construct: &'static str,
    },
    /// A value did not decode into its type.
    #[error("line {line}: {message}")]
    Decode {
        /// 1-based line (0 until the place is known).
        line: usize,
        /// The decoder's message.
        message: String,
    },
}

impl de::Error for BlockYamlError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        BlockYamlError::Decode {
            line: 0,
            message: msg.to_string(),
        }
    }
}

type Result<T> = std::result::Result<T, BlockYamlError>;

/// Containers nested deeper than this are left to serde-saphyr (its budget stops at 64).
const MAX_DEPTH: usize = 48;
/// Longer keys are left to serde-saphyr (its simple-key lookahead is 1,024 characters).
const MAX_KEY_BYTES: usize = 512;
/// Longer runs of comment lines are left to serde-saphyr (it buffers at most 32).
const MAX_COMMENT_RUN: usize = 16;
/// More comment text is left to serde-saphyr (its budget is 64 MiB).
const MAX_COMMENT_BYTES: usize = 16 << 20;
/// Maps with more keys check duplicates through a hash set.
const LINEAR_KEYS: usize = 32;

/// Reads every document of `text` as `from_str_multiple` does: a document that is empty or a
/// null scalar adds nothing, each other one is decoded as a `T` and added to the collection.
pub fn from_str_multiple<'de, T, C>(text: &'de str) -> Result<C>
where
    T: de::Deserialize<'de>,
    C: Default + Extend<T>,
{
    let mut p = Parser {
        b: text.as_bytes(),
        text,
        pos: 0,
        depth: 0,
        keys: Vec::new(),
        comment_bytes: 0,
    };
    p.check_characters()?;
    let mut out = C::default();
    p.documents::<T, C>(&mut out).map_err(|e| p.place(e))?;
    Ok(out)
}

struct Parser<'de> {
    text: &'de str,
    b: &'de [u8],
    /// Always at a line start between nodes.
    pos: usize,
    depth: usize,
    /// Keys of the mappings being read, innermost last (duplicate check).
    keys: Vec<Cow<'de, str>>,
    comment_bytes: usize,
}

/// A scalar: its value, and whether it was plain (only plain scalars resolve to null, booleans
/// and numbers).
struct Scalar<'de> {
    text: Cow<'de, str>,
    plain: bool,
}

enum Node<'de> {
    Scalar(Scalar<'de>),
    /// A block mapping; `pos` is at its first key.
    Map {
        indent: usize,
    },
    /// A block sequence; `pos` is at its first `-`. `compact`: at its key's indentation.
    Seq {
        indent: usize,
        compact: bool,
    },
    EmptyMap,
    EmptySeq,
}

/// Where the reading of a block collection stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// At its first entry.
    First,
    /// After an entry.
    More,
    /// Past its end.
    Done,
}

/// Where a value starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// After `key:`.
    Key,
    /// After `-`.
    Item,
}

fn null_scalar<'de>() -> Scalar<'de> {
    Scalar {
        text: Cow::Borrowed(""),
        plain: true,
    }
}

impl<'de> Parser<'de> {
    fn line_of(&self, pos: usize) -> usize {
        1 + self.b[..pos.min(self.b.len())]
            .iter()
            .filter(|&&c| c == b'\n')
            .count()
    }

    fn bail(&self, construct: &'static str) -> BlockYamlError {
        BlockYamlError::Read {
            line: self.line_of(self.pos),
            construct,
        }
    }

    /// Gives a decoding error the line the parser had reached.
    fn place(&self, e: BlockYamlError) -> BlockYamlError {
        match e {
            BlockYamlError::Decode { line: 0, message } => BlockYamlError::Decode {
                line: self.line_of(self.pos),
                message,
            },
            e => e,
        }
    }

    /// Refuses characters whose handling differs between YAML versions or parsers: tabs,
    /// carriage returns, other control characters, byte order marks, Unicode line separators
    /// and non-characters.
    fn check_characters(&mut self) -> Result<()> {
        let b = self.b;
        let mut i = 0;
        while i < b.len() {
            // Eight printable ASCII bytes at a time (a line break sends its word to the loop).
            if i + 8 <= b.len() {
                let w = word(b, i);
                if (w.wrapping_sub(LO * 0x20) | w.wrapping_add(LO) | w) & HI == 0 {
                    i += 8;
                    continue;
                }
            }
            let c = b[i];
            let bad = match c {
                b'\n' => false,
                0..=0x1f | 0x7f => true,
                0xc2 => b.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)),
                0xe2 => b.get(i + 1) == Some(&0x80) && matches!(b.get(i + 2), Some(0xa8 | 0xa9)),
                0xef => matches!(
                    (b.get(i + 1), b.get(i + 2)),
                    (Some(0xbb), Some(0xbf)) | (Some(0xbf), Some(0xbe | 0xbf))
                ),
                _ => false,
            };
            if bad {
                self.pos = i;
                return Err(self.bail("a tab, carriage return, control character or byte order mark"));
            }
            i += 1;
        }
        Ok(())
    }

    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(b'\n')
    }

    fn line_end(&self, from: usize) -> usize {
        find_any(self.b, from, [b'\n'; 3])
    }

    /// The start of the line after the one holding `from`.
    fn next_line(&self, from: usize) -> usize {
        (self.line_end(from) + 1).min(self.b.len())
    }

    fn spaces(&self, from: usize) -> usize {
        self.b[from..].iter().take_while(|&&c| c == b' ').count()
    }

    /// A `---` or `...` line at `pos` (a line start).
    fn marker(&self, pos: usize) -> Option<u8> {
        let b = self.b;
        if b.len() >= pos + 3
            && (b[pos..pos + 3] == *b"---" || b[pos..pos + 3] == *b"...")
            && matches!(self.at(pos + 3), b' ' | b'\n')
        {
            Some(b[pos])
        } else {
            None
        }
    }

    fn column(&self, i: usize) -> usize {
        i - self.b[..i].iter().rposition(|&x| x == b'\n').map_or(0, |x| x + 1)
    }

    /// `-` followed by a space or the line end.
    fn dash(&self, i: usize) -> bool {
        self.at(i) == b'-' && i < self.b.len() && matches!(self.at(i + 1), b' ' | b'\n')
    }

    /// From a line start, skips blank and comment lines; stops at the next content line and
    /// gives its indentation, or `None` at the end of the text or of the document.
    fn next_content(&mut self) -> Result<Option<usize>> {
        let mut run = 0;
        loop {
            if self.pos >= self.b.len() {
                return Ok(None);
            }
            let i = self.spaces(self.pos);
            match self.at(self.pos + i) {
                b'\n' => {
                    self.pos = self.next_line(self.pos);
                    run = 0;
                }
                b'#' => {
                    let end = self.line_end(self.pos);
                    self.comment_bytes += end - self.pos;
                    run += 1;
                    if run > MAX_COMMENT_RUN || self.comment_bytes > MAX_COMMENT_BYTES {
                        return Err(self.bail("a long run of comments"));
                    }
                    self.pos = self.next_line(self.pos);
                }
                _ if i == 0 && self.marker(self.pos).is_some() => return Ok(None),
                _ => return Ok(Some(i)),
            }
        }
    }

    /// The rest of the line from `i` holds only spaces; moves to the next line.
    fn end_line(&mut self, i: usize) -> Result<()> {
        let j = i + self.spaces(i);
        match self.at(j) {
            b'\n' => {
                self.pos = (j + 1).min(self.b.len());
                Ok(())
            }
            b'#' if j > i => {
                self.pos = j;
                Err(self.bail("a comment after a value"))
            }
            _ => {
                self.pos = j;
                Err(self.bail("text after a value"))
            }
        }
    }

    fn documents<T, C>(&mut self, out: &mut C) -> Result<()>
    where
        T: de::Deserialize<'de>,
        C: Extend<T>,
    {
        let mut first = true;
        loop {
            // Blank and comment lines, then a marker, a document, or the end.
            self.next_content()?;
            if self.pos >= self.b.len() {
                return Ok(());
            }
            match self.marker(self.pos) {
                Some(b'-') => self.end_line(self.pos + 3)?,
                Some(_) => {
                    // `...` ends a document; only `---` or the end may follow.
                    self.end_line(self.pos + 3)?;
                    self.next_content()?;
                    if self.pos < self.b.len() && self.marker(self.pos) != Some(b'-') {
                        return Err(self.bail("a document after `...` without `---`"));
                    }
                    continue;
                }
                None if first => {
                    if self.at(self.pos) == b'%' {
                        return Err(self.bail("a directive"));
                    }
                }
                None => return Err(self.bail("content after a document")),
            }
            first = false;
            let Some(indent) = self.next_content()? else {
                continue;
            };
            if indent != 0 {
                return Err(self.bail("an indented document"));
            }
            let node = self.root()?;
            if let Node::Scalar(s) = &node
                && s.plain
                && nullish(&s.text)
            {
                // An empty or null document adds nothing.
            } else {
                let value = T::deserialize(NodeDe { p: self, node })?;
                out.extend(std::iter::once(value));
            }
            if self.next_content()?.is_some() {
                return Err(self.bail("content after a document"));
            }
        }
    }

    /// The root node of a document at a line start, indentation 0.
    fn root(&mut self) -> Result<Node<'de>> {
        if self.dash(self.pos) {
            return Ok(Node::Seq {
                indent: 0,
                compact: false,
            });
        }
        if let Some(node) = self.empty_flow(self.pos)? {
            return Ok(node);
        }
        if self.key_end(self.pos)?.is_some() {
            return Ok(Node::Map { indent: 0 });
        }
        let s = self.inline_scalar(-1)?;
        Ok(Node::Scalar(s))
    }

    /// The node of a value after `key:` (`n`: the mapping's indentation) or `-` (`n`: the
    /// sequence's).
    fn value(&mut self, n: usize, ctx: Ctx) -> Result<Node<'de>> {
        let start = self.pos;
        let c = start + self.spaces(start);
        if self.at(c) == b'\n' {
            self.pos = if c >= self.b.len() { c } else { c + 1 };
            let Some(i) = self.next_content()? else {
                return Ok(Node::Scalar(null_scalar()));
            };
            let line = self.pos;
            if i > n {
                self.pos = line + i;
                if self.dash(self.pos) {
                    return Ok(Node::Seq {
                        indent: i,
                        compact: false,
                    });
                }
                if self.key_end(self.pos)?.is_some() {
                    return Ok(Node::Map { indent: i });
                }
                return Err(self.bail("a scalar on the line after its key"));
            }
            if i == n && ctx == Ctx::Key && self.dash(line + i) {
                self.pos = line + i;
                return Ok(Node::Seq {
                    indent: n,
                    compact: true,
                });
            }
            return Ok(Node::Scalar(null_scalar()));
        }
        self.pos = c;
        if self.at(c) == b'#' {
            return Err(self.bail("a comment after a key"));
        }
        if self.dash(c) {
            if ctx == Ctx::Item {
                return Ok(Node::Seq {
                    indent: self.column(c),
                    compact: false,
                });
            }
            return Err(self.bail("a sequence on the line of its key"));
        }
        if let Some(node) = self.empty_flow(c)? {
            return Ok(node);
        }
        // After a key, `a: b: c` is refused by the scalar's reading (`: ` in a plain scalar,
        // text after a quoted one).
        if ctx == Ctx::Item && self.key_end(c)?.is_some() {
            return Ok(Node::Map {
                indent: self.column(c),
            });
        }
        Ok(Node::Scalar(self.inline_scalar(n as isize)?))
    }

    /// `{}` or `[]` at `c`, the rest of its line empty; other flow collections are refused.
    fn empty_flow(&mut self, c: usize) -> Result<Option<Node<'de>>> {
        let node = match (self.at(c), self.at(c + 1)) {
            (b'{', b'}') => Node::EmptyMap,
            (b'[', b']') => Node::EmptySeq,
            (b'{' | b'[', _) => return Err(self.bail("a flow collection")),
            _ => return Ok(None),
        };
        self.end_line(c + 2)?;
        Ok(Some(node))
    }

    /// If a key starts at `i` (on this line): the position after its `:`.
    fn key_end(&mut self, i: usize) -> Result<Option<usize>> {
        match self.at(i) {
            q @ (b'"' | b'\'') => {
                // A quoted key closes on its line.
                let end = self.line_end(i);
                let mut j = i + 1;
                while j < end {
                    let c = self.b[j];
                    if q == b'\'' && c == b'\'' {
                        if self.at(j + 1) == b'\'' {
                            j += 2;
                            continue;
                        }
                        break;
                    }
                    if q == b'"' && c == b'\\' {
                        j += 2;
                        continue;
                    }
                    if q == b'"' && c == b'"' {
                        break;
                    }
                    j += 1;
                }
                if j >= end {
                    return Ok(None);
                }
                let k = j + 1 + self.spaces(j + 1);
                Ok((self.at(k) == b':' && matches!(self.at(k + 1), b' ' | b'\n')).then_some(k + 1))
            }
            _ => {
                let mut j = i;
                loop {
                    j = find_any(self.b, j, [b'\n', b':', b'#']);
                    match self.at(j) {
                        b':' if matches!(self.at(j + 1), b' ' | b'\n') => return Ok(Some(j + 1)),
                        b'#' if j > i && self.b[j - 1] == b' ' => return Ok(None),
                        b':' | b'#' => j += 1,
                        _ => return Ok(None),
                    }
                }
            }
        }
    }

    /// Reads the key at `pos`; leaves `pos` after its `:`.
    fn key(&mut self) -> Result<Scalar<'de>> {
        let start = self.pos;
        let Some(after) = self.key_end(start)? else {
            return Err(self.bail("a line that is not `key: value` in a mapping"));
        };
        if after - start > MAX_KEY_BYTES {
            return Err(self.bail("a long key"));
        }
        let s = match self.at(start) {
            b'"' | b'\'' => self.quoted(0)?,
            c => {
                if is_indicator(c) || (c == b'-' && self.at(start + 1) == b' ') {
                    return Err(self.bail("a key starting with an indicator"));
                }
                let raw = self.text[start..after - 1].trim_end_matches(' ');
                if nullish(raw) || raw == "<<" || int_key(raw) {
                    return Err(self.bail("a null, merge or integer key"));
                }
                Scalar {
                    text: Cow::Borrowed(raw),
                    plain: true,
                }
            }
        };
        self.pos = after;
        Ok(s)
    }

    /// A scalar starting at `pos` on its line; `n`: the indentation of the collection holding
    /// it (continuation lines are indented more). Leaves `pos` at the next line.
    fn inline_scalar(&mut self, n: isize) -> Result<Scalar<'de>> {
        let s = match self.at(self.pos) {
            b'"' | b'\'' => self.quoted(n)?,
            b'|' | b'>' => return self.block_scalar(n),
            _ => return self.plain(n),
        };
        self.end_line(self.pos)?;
        Ok(s)
    }

    fn plain(&mut self, n: isize) -> Result<Scalar<'de>> {
        let start = self.pos;
        let c = self.at(start);
        if is_indicator(c) || (matches!(c, b'-' | b'?' | b':') && matches!(self.at(start + 1), b' ' | b'\n'))
        {
            return Err(self.bail("a scalar starting with an indicator"));
        }
        let end = self.plain_line(start)?;
        let first = self.text[start..end].trim_end_matches(' ');
        self.pos = (end + 1).min(self.b.len());
        // Continuation lines: indented more than `n`, folded.
        let mut folded: Option<String> = None;
        let mut blanks = 0;
        let mut at = self.pos;
        while n >= 0 && at < self.b.len() {
            let i = self.spaces(at);
            match self.at(at + i) {
                b'\n' => {
                    blanks += 1;
                    at = self.next_line(at);
                    continue;
                }
                b'#' => break,
                _ if (i as isize) <= n => break,
                c if is_indicator(c) || matches!(c, b'-' | b'?' | b':') => {
                    self.pos = at + i;
                    return Err(self.bail("a continuation line starting with an indicator"));
                }
                _ => {}
            }
            let e = self.plain_line(at + i)?;
            let more = self.text[at + i..e].trim_end_matches(' ');
            let f = folded.get_or_insert_with(|| first.to_owned());
            if blanks == 0 {
                f.push(' ');
            } else {
                f.extend(std::iter::repeat_n('\n', blanks));
            }
            f.push_str(more);
            blanks = 0;
            at = if e >= self.b.len() { e } else { e + 1 };
            self.pos = at;
        }
        Ok(Scalar {
            text: folded.map_or(Cow::Borrowed(first), Cow::Owned),
            plain: true,
        })
    }

    /// The end of a plain scalar's line from `i`; refuses `: ` and ` #` inside.
    fn plain_line(&mut self, i: usize) -> Result<usize> {
        let mut j = i;
        loop {
            j = find_any(self.b, j, [b'\n', b':', b'#']);
            match self.at(j) {
                b':' if matches!(self.at(j + 1), b' ' | b'\n') => {
                    self.pos = j;
                    return Err(self.bail("`: ` inside a plain scalar"));
                }
                b'#' if j > 0 && self.b[j - 1] == b' ' => {
                    self.pos = j;
                    return Err(self.bail("a comment after a value"));
                }
                b':' | b'#' => j += 1,
                _ => return Ok(j.min(self.b.len())),
            }
        }
    }

    /// After a line break inside a quoted scalar: skips the break, counts the empty lines
    /// after it and the indentation of the next line; `pos` ends at its text.
    fn fold_break(&mut self, n: isize) -> Result<usize> {
        let mut empty = 0;
        loop {
            self.pos += 1; // the line break
            let line = self.pos;
            if line >= self.b.len() {
                return Err(self.bail("an unclosed quoted scalar"));
            }
            let i = self.spaces(line);
            if self.at(line + i) == b'\n' && line + i < self.b.len() {
                empty += 1;
                self.pos = line + i;
                continue;
            }
            if (i as isize) <= n.max(0) || (i == 0 && self.marker(line).is_some()) {
                return Err(self.bail("a quoted scalar line not indented"));
            }
            self.pos = line + i;
            return Ok(empty);
        }
    }

    /// A single- or double-quoted scalar at `pos`; `n`: the indentation its continuation
    /// lines must exceed. Leaves `pos` after the closing quote.
    fn quoted(&mut self, n: isize) -> Result<Scalar<'de>> {
        let open = self.pos;
        let q = self.b[open];
        let double = q == b'"';
        // The special bytes: the quote, and a backslash in double quotes.
        let escape = if double { b'\\' } else { q };
        // A single line without escapes: borrowed.
        let end = self.line_end(open + 1);
        if let Some(k) = self.b[open + 1..end].iter().position(|&c| c == q || c == escape)
            && self.b[open + 1 + k] == q
            && (double || self.at(open + 2 + k) != q)
        {
            self.pos = open + 2 + k;
            return Ok(Scalar {
                text: Cow::Borrowed(&self.text[open + 1..open + 1 + k]),
                plain: false,
            });
        }
        let mut out = String::new();
        // Spaces are held back until it is known they do not end a line (then they go).
        let mut spaces = 0;
        self.pos = open + 1;
        loop {
            let rest = &self.b[self.pos..];
            let run = rest
                .iter()
                .position(|&c| c == q || c == escape || c == b'\n' || c == b' ')
                .ok_or_else(|| self.bail("an unclosed quoted scalar"))?;
            if run > 0 {
                out.extend(std::iter::repeat_n(' ', spaces));
                spaces = 0;
                out.push_str(&self.text[self.pos..self.pos + run]);
                self.pos += run;
            }
            let c = self.b[self.pos];
            if c == b' ' {
                spaces += 1;
                self.pos += 1;
                continue;
            }
            if c == b'\n' {
                // Spaces before a line break go; the break folds.
                spaces = 0;
                let empty = self.fold_break(n)?;
                if empty == 0 {
                    out.push(' ');
                } else {
                    out.extend(std::iter::repeat_n('\n', empty));
                }
                continue;
            }
            out.extend(std::iter::repeat_n(' ', spaces));
            spaces = 0;
            if c == q && !double && self.at(self.pos + 1) == q {
                out.push('\'');
                self.pos += 2;
            } else if c == q {
                self.pos += 1;
                return Ok(Scalar {
                    text: Cow::Owned(out),
                    plain: false,
                });
            } else {
                self.escape(&mut out, n)?;
            }
        }
    }

    /// The escape at `pos` (a backslash).
    fn escape(&mut self, out: &mut String, n: isize) -> Result<()> {
        let c = self.at(self.pos + 1);
        let simple = match c {
            b'0' => '\0',
            b'a' => '\u{7}',
            b'b' => '\u{8}',
            b't' => '\t',
            b'n' => '\n',
            b'v' => '\u{b}',
            b'f' => '\u{c}',
            b'r' => '\r',
            b'e' => '\u{1b}',
            b' ' => ' ',
            b'"' => '"',
            b'/' => '/',
            b'\\' => '\\',
            b'N' => '\u{85}',
            b'_' => '\u{a0}',
            b'L' => '\u{2028}',
            b'P' => '\u{2029}',
            b'x' | b'u' | b'U' => {
                let digits = match c {
                    b'x' => 2,
                    b'u' => 4,
                    _ => 8,
                };
                let from = self.pos + 2;
                let hex = self
                    .text
                    .get(from..from + digits)
                    .filter(|h| h.bytes().all(|d| d.is_ascii_hexdigit()))
                    .ok_or_else(|| self.bail("a bad escape"))?;
                let ch = u32::from_str_radix(hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| self.bail("a bad escape"))?;
                out.push(ch);
                self.pos = from + digits;
                return Ok(());
            }
            b'\n' if self.pos + 1 < self.b.len() => {
                // An escaped line break: joined without a space; empty lines after it stay.
                self.pos += 1;
                let empty = self.fold_break(n)?;
                out.extend(std::iter::repeat_n('\n', empty));
                return Ok(());
            }
            _ => return Err(self.bail("a bad escape")),
        };
        out.push(simple);
        self.pos += 2;
        Ok(())
    }

    /// A literal (`|`) or folded (`>`) block scalar; `n`: the parent's indentation.
    fn block_scalar(&mut self, n: isize) -> Result<Scalar<'de>> {
        if n < 0 {
            return Err(self.bail("a block scalar as a document"));
        }
        let literal = self.b[self.pos] == b'|';
        let mut i = self.pos + 1;
        // Header: chomping and indentation indicators, in either order.
        let mut chomp = b' ';
        let mut explicit = None;
        for _ in 0..2 {
            match self.at(i) {
                c @ (b'-' | b'+') if chomp == b' ' => chomp = c,
                c @ b'1'..=b'9' if explicit.is_none() => explicit = Some(usize::from(c - b'0')),
                _ => break,
            }
            i += 1;
        }
        self.end_line(i)?;
        if let Some(d) = explicit {
            // Relative to the indentation of the collection holding it, as serde-saphyr's
            // parser counts it.
            return self.block_lines(n as usize + d, literal, chomp);
        }
        // Content indentation: the first non-empty line's.
        let mut at = self.pos;
        let mut lead = 0;
        let k = loop {
            if at >= self.b.len() {
                break None;
            }
            let s = self.spaces(at);
            if self.at(at + s) == b'\n' {
                if at + s >= self.b.len() {
                    break None;
                }
                lead = lead.max(s);
                at = self.next_line(at);
                continue;
            }
            break Some(s);
        };
        let k = match k {
            Some(k) if (k as isize) > n => k,
            _ => {
                if chomp == b'+' {
                    return Err(self.bail("an empty kept block scalar"));
                }
                return Ok(Scalar {
                    text: Cow::Borrowed(""),
                    plain: false,
                });
            }
        };
        if lead > k {
            return Err(self.bail("a block scalar with leading spaces lines"));
        }
        self.block_lines(k, literal, chomp)
    }

    /// The lines of a block scalar indented by `k` or more, from `pos`.
    fn block_lines(&mut self, k: usize, literal: bool, chomp: u8) -> Result<Scalar<'de>> {
        let mut out = String::new();
        let mut pending = 0;
        let mut started = false;
        let mut prev_more = false;
        let mut at = self.pos;
        loop {
            if at >= self.b.len() {
                break;
            }
            let end = self.line_end(at);
            let s = self.spaces(at);
            let blank = at + s == end;
            if blank && s <= k {
                if end >= self.b.len() {
                    break;
                }
                pending += 1;
                at = end + 1;
                continue;
            }
            if !blank && s < k {
                break;
            }
            if end >= self.b.len() {
                self.pos = end;
                return Err(self.bail("a block scalar without a final line break"));
            }
            let t = &self.text[at + k..end];
            let more = t.starts_with(' ');
            if !started {
                out.extend(std::iter::repeat_n('\n', pending));
            } else if literal || prev_more || more {
                out.extend(std::iter::repeat_n('\n', pending + 1));
            } else if pending == 0 {
                out.push(' ');
            } else {
                out.extend(std::iter::repeat_n('\n', pending));
            }
            out.push_str(t);
            started = true;
            prev_more = more;
            pending = 0;
            at = end + 1;
        }
        match chomp {
            _ if !started && chomp == b'+' => return Err(self.bail("an empty kept block scalar")),
            _ if !started => {}
            b'-' => {}
            b'+' => out.extend(std::iter::repeat_n('\n', pending + 1)),
            _ => out.push('\n'),
        }
        self.pos = at;
        Ok(Scalar {
            text: Cow::Owned(out),
            plain: false,
        })
    }

    /// Moves to the next entry of the block collection at `indent`: a key, or for a sequence
    /// (`items`: whether it is compact) a dash. A line at `indent` without a dash ends a
    /// compact sequence (its key's mapping goes on).
    fn next_entry(&mut self, walk: &mut Walk, indent: usize, items: Option<bool>) -> Result<bool> {
        match *walk {
            Walk::Done => return Ok(false),
            Walk::First => {
                *walk = Walk::More;
                return Ok(true);
            }
            Walk::More => {}
        }
        match self.next_content()? {
            Some(i) if i == indent && (items.is_none() || self.dash(self.pos + i)) => {
                self.pos += i;
                Ok(true)
            }
            Some(i) if i > indent || (i == indent && items == Some(false)) => {
                self.pos += i;
                Err(self.bail("unexpected indentation in a block collection"))
            }
            _ => {
                *walk = Walk::Done;
                Ok(false)
            }
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.bail("deep nesting"));
        }
        Ok(())
    }

    fn visit_map<V: Visitor<'de>>(&mut self, indent: usize, visitor: V) -> Result<V::Value> {
        self.enter()?;
        let base = self.keys.len();
        let mut access = BlockMap {
            p: &mut *self,
            indent,
            walk: Walk::First,
            base,
            set: None,
        };
        let value = visitor.visit_map(&mut access)?;
        if access.p.next_entry(&mut access.walk, indent, None)? {
            return Err(self.bail("a mapping not read to its end"));
        }
        self.keys.truncate(base);
        self.depth -= 1;
        Ok(value)
    }

    fn visit_seq<V: Visitor<'de>>(&mut self, indent: usize, compact: bool, visitor: V) -> Result<V::Value> {
        self.enter()?;
        let mut access = BlockSeq {
            p: &mut *self,
            indent,
            compact,
            walk: Walk::First,
        };
        let value = visitor.visit_seq(&mut access)?;
        if access.p.next_entry(&mut access.walk, indent, Some(compact))? {
            return Err(self.bail("a sequence not read to its end"));
        }
        self.depth -= 1;
        Ok(value)
    }

    fn visit_empty<V: Visitor<'de>>(&mut self, map: bool, visitor: V) -> Result<V::Value> {
        self.enter()?;
        let value = if map {
            visitor.visit_map(Empty)?
        } else {
            visitor.visit_seq(Empty)?
        };
        self.depth -= 1;
        Ok(value)
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// Bytes of `w` equal to `c` have their high bit set (and maybe bytes after one, which only
/// sends the search to the byte loop).
fn has_byte(w: u64, c: u8) -> u64 {
    let x = w ^ (LO * u64::from(c));
    x.wrapping_sub(LO) & !x & HI
}

/// The first of the bytes `set` from `i`, or the end: eight bytes at a time.
fn find_any(b: &[u8], mut i: usize, set: [u8; 3]) -> usize {
    while i + 8 <= b.len() {
        let w = word(b, i);
        if has_byte(w, set[0]) | has_byte(w, set[1]) | has_byte(w, set[2]) != 0 {
            break;
        }
        i += 8;
    }
    while i < b.len() && !set.contains(&b[i]) {
        i += 1;
    }
    i
}

/// Indicators a plain scalar or key cannot start with (`-`, `?`, `:` followed by a space are
/// checked apart).
fn is_indicator(c: u8) -> bool {
    matches!(
        c,
        b'#' | b'&'
            | b'*'
            | b'!'
            | b'|'
            | b'>'
            | b'\''
            | b'"'
            | b'%'
            | b'@'
            | b'`'
            | b'['
            | b']'
            | b'{'
            | b'}'
            | b','
    )
}

struct BlockMap<'a, 'de> {
    p: &'a mut Parser<'de>,
    indent: usize,
    walk: Walk,
    base: usize,
    set: Option<HashSet<Cow<'de, str>>>,
}

impl<'de> MapAccess<'de> for BlockMap<'_, 'de> {
    type Error = BlockYamlError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if !self.p.next_entry(&mut self.walk, self.indent, None)? {
            return Ok(None);
        }
        if self.p.dash(self.p.pos) {
            return Err(self.p.bail("a sequence item where a key was expected"));
        }
        let key = self.p.key()?;
        // Duplicates are serde-saphyr's to report.
        let seen = match &mut self.set {
            Some(set) => !set.insert(key.text.clone()),
            None => {
                let seen = self.p.keys[self.base..].contains(&key.text);
                self.p.keys.push(key.text.clone());
                if self.p.keys.len() - self.base > LINEAR_KEYS {
                    self.set = Some(self.p.keys.drain(self.base..).collect());
                }
                seen
            }
        };
        if seen {
            return Err(self.p.bail("a duplicate key"));
        }
        seed.deserialize(NodeDe {
            p: &mut *self.p,
            node: Node::Scalar(key),
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(ValueDe {
            p: &mut *self.p,
            n: self.indent,
            ctx: Ctx::Key,
        })
    }
}

struct BlockSeq<'a, 'de> {
    p: &'a mut Parser<'de>,
    indent: usize,
    compact: bool,
    walk: Walk,
}

impl<'de> SeqAccess<'de> for BlockSeq<'_, 'de> {
    type Error = BlockYamlError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if !self
            .p
            .next_entry(&mut self.walk, self.indent, Some(self.compact))?
        {
            return Ok(None);
        }
        self.p.pos += 1; // the dash
        seed.deserialize(ValueDe {
            p: &mut *self.p,
            n: self.indent,
            ctx: Ctx::Item,
        })
        .map(Some)
    }
}

/// `{}` and `[]`.
struct Empty;

impl<'de> MapAccess<'de> for Empty {
    type Error = BlockYamlError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, _: K) -> Result<Option<K::Value>> {
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, _: V) -> Result<V::Value> {
        Err(de::Error::custom("value requested before key"))
    }
}

impl<'de> SeqAccess<'de> for Empty {
    type Error = BlockYamlError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, _: T) -> Result<Option<T::Value>> {
        Ok(None)
    }
}

/// A value not read yet: its node is parsed when the type asks for it.
struct ValueDe<'a, 'de> {
    p: &'a mut Parser<'de>,
    n: usize,
    ctx: Ctx,
}

impl<'a, 'de> ValueDe<'a, 'de> {
    fn node(self) -> Result<NodeDe<'a, 'de>> {
        let node = self.p.value(self.n, self.ctx)?;
        Ok(NodeDe { p: self.p, node })
    }
}

macro_rules! forward_value {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value> {
                self.node()?.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de> Deserializer<'de> for ValueDe<'_, 'de> {
    type Error = BlockYamlError;

    forward_value! {
        deserialize_any(), deserialize_bool(), deserialize_i8(), deserialize_i16(),
        deserialize_i32(), deserialize_i64(), deserialize_i128(), deserialize_u8(),
        deserialize_u16(), deserialize_u32(), deserialize_u64(), deserialize_u128(),
        deserialize_f32(), deserialize_f64(), deserialize_char(), deserialize_str(),
        deserialize_string(), deserialize_bytes(), deserialize_byte_buf(), deserialize_option(),
        deserialize_unit(), deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str), deserialize_seq(),
        deserialize_tuple(len: usize), deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_map(), deserialize_struct(name: &'static str, fields: &'static [&'static str]),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
        deserialize_identifier(), deserialize_ignored_any(),
    }
}

/// Integer methods: the scalar's text, parsed as serde-saphyr parses it whatever its style.
macro_rules! integers {
    ($($method:ident $visit:ident $parse:ident $what:literal),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
                visitor.$visit(self.$parse($what)?)
            }
        )*
    };
}

/// A parsed node (a scalar, or the start of a collection).
struct NodeDe<'a, 'de> {
    p: &'a mut Parser<'de>,
    node: Node<'de>,
}

impl<'de> NodeDe<'_, 'de> {
    fn bail(&self, construct: &'static str) -> BlockYamlError {
        self.p.bail(construct)
    }

    /// The scalar, or an error for a collection.
    fn scalar(self, what: &'static str) -> Result<Scalar<'de>> {
        match self.node {
            Node::Scalar(s) => Ok(s),
            _ => Err(de::Error::custom(format_args!(
                "expected {what}, found a collection"
            ))),
        }
    }

    fn int<T: TryFrom<i128>>(self, what: &'static str) -> Result<T> {
        let s = self.scalar(what)?;
        int_signed(&s.text)
            .and_then(|v| T::try_from(v).ok())
            .ok_or_else(|| de::Error::custom(format_args!("invalid {what}")))
    }

    fn uint<T: TryFrom<u128>>(self, what: &'static str) -> Result<T> {
        let s = self.scalar(what)?;
        int_unsigned(&s.text)
            .and_then(|v| T::try_from(v).ok())
            .ok_or_else(|| de::Error::custom(format_args!("invalid {what}")))
    }

    fn visit_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let s = self.scalar("a string")?;
        if s.plain && nullish(&s.text) {
            return Err(de::Error::custom("null into a string"));
        }
        match s.text {
            Cow::Borrowed(b) => visitor.visit_borrowed_str(b),
            Cow::Owned(o) => visitor.visit_string(o),
        }
    }
}

impl<'de> Deserializer<'de> for NodeDe<'_, 'de> {
    type Error = BlockYamlError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.node {
            Node::Map { indent } => self.p.visit_map(indent, visitor),
            Node::Seq { indent, compact } => self.p.visit_seq(indent, compact, visitor),
            Node::EmptyMap => self.p.visit_empty(true, visitor),
            Node::EmptySeq => self.p.visit_empty(false, visitor),
            Node::Scalar(s) if !s.plain => match s.text {
                Cow::Borrowed(b) => visitor.visit_borrowed_str(b),
                Cow::Owned(o) => visitor.visit_string(o),
            },
            Node::Scalar(s) => {
                let t = s.text.as_ref();
                if nullish(t) {
                    return visitor.visit_unit();
                }
                // Most names start with a letter no null, boolean or number starts with.
                if t.as_bytes()[0].is_ascii_alphabetic() && !b"tfynoTFYNO".contains(&t.as_bytes()[0]) {
                    return match s.text {
                        Cow::Borrowed(b) => visitor.visit_borrowed_str(b),
                        Cow::Owned(o) => visitor.visit_string(o),
                    };
                }
                if let Some(b) = yaml11_bool(t) {
                    return visitor.visit_bool(b);
                }
                let tt = yaml_trim(t);
                if tt.starts_with('-') {
                    if !leading_zero_decimal(tt)
                        && let Some(v) = int_signed(tt).and_then(|v| i64::try_from(v).ok())
                    {
                        return visitor.visit_i64(v);
                    }
                } else if let Some(v) = int_unsigned(tt).and_then(|v| u64::try_from(v).ok()) {
                    return visitor.visit_u64(v);
                }
                if let Some(v) = float_incl_overflow(t) {
                    if !v.is_finite() {
                        return Err(de::Error::custom("a non-finite float where no type is asked for"));
                    }
                    return visitor.visit_f64(v);
                }
                match s.text {
                    Cow::Borrowed(b) => visitor.visit_borrowed_str(b),
                    Cow::Owned(o) => visitor.visit_string(o),
                }
            }
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let s = self.scalar("a boolean")?;
        let b = yaml11_bool(&s.text).ok_or_else(|| de::Error::custom("invalid boolean"))?;
        visitor.visit_bool(b)
    }

    integers! {
        deserialize_i8 visit_i8 int "i8", deserialize_i16 visit_i16 int "i16",
        deserialize_i32 visit_i32 int "i32", deserialize_i64 visit_i64 int "i64",
        deserialize_i128 visit_i128 int "i128", deserialize_u8 visit_u8 uint "u8",
        deserialize_u16 visit_u16 uint "u16", deserialize_u32 visit_u32 uint "u32",
        deserialize_u64 visit_u64 uint "u64", deserialize_u128 visit_u128 uint "u128",
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let s = self.scalar("a float")?;
        let v = typed_float::<f32>(&s.text, f32::NAN, f32::INFINITY, |v| v.is_finite())
            .ok_or_else(|| de::Error::custom("invalid floating point"))?;
        visitor.visit_f32(v)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let s = self.scalar("a float")?;
        let v = typed_float::<f64>(&s.text, f64::NAN, f64::INFINITY, |v| v.is_finite())
            .ok_or_else(|| de::Error::custom("invalid floating point"))?;
        visitor.visit_f64(v)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let s = self.scalar("a character")?;
        let mut chars = s.text.chars();
        match (s.plain && nullish(&s.text), chars.next(), chars.next()) {
            (false, Some(c), None) => visitor.visit_char(c),
            _ => Err(de::Error::custom("expected a single character")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_str(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(self.bail("bytes"))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(self.bail("bytes"))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match &self.node {
            Node::Scalar(s) if s.plain && nullish(&s.text) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match &self.node {
            Node::Scalar(s) if s.plain && nullish(&s.text) => visitor.visit_unit(),
            _ => Err(de::Error::custom("expected null")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value> {
        match &self.node {
            Node::EmptyMap => visitor.visit_unit(),
            _ => self.deserialize_unit(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value> {
        if name.starts_with("__yaml") {
            return Err(self.bail("a serde-saphyr wrapper type"));
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.node {
            Node::Scalar(s) if s.plain && nullish(&s.text) => self.p.visit_empty(false, visitor),
            Node::Seq { indent, compact } => self.p.visit_seq(indent, compact, visitor),
            Node::EmptySeq => self.p.visit_empty(false, visitor),
            _ => Err(self.p.bail("a sequence asked of another node")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.node {
            Node::Scalar(s) if s.plain && nullish(&s.text) => self.p.visit_empty(true, visitor),
            Node::Map { indent } => self.p.visit_map(indent, visitor),
            Node::EmptyMap => self.p.visit_empty(true, visitor),
            _ => Err(self.p.bail("a mapping asked of another node")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value> {
        Err(self.bail("an enum"))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // serde-saphyr resolves ignored values as any other (a `.inf` there is an error).
        self.deserialize_any(visitor)
    }
}

/// Scalar resolution, as serde-saphyr's `parse_scalars` with its default options.
fn nullish(s: &str) -> bool {
    s.is_empty() || s == "~" || s.eq_ignore_ascii_case("null")
}

fn yaml_trim(s: &str) -> &str {
    s.trim_matches([' ', '\t', '\r', '\n'])
}

fn yaml11_bool(s: &str) -> Option<bool> {
    let t = yaml_trim(s);
    let is = |w: &str| t.eq_ignore_ascii_case(w);
    if is("true") || is("yes") || is("y") || is("on") {
        Some(true)
    } else if is("false") || is("no") || is("n") || is("off") {
        Some(false)
    } else {
        None
    }
}

/// Digits with single `_` between them, in `radix`.
fn digits(d: &str, radix: u32) -> Option<u128> {
    let b = d.as_bytes();
    let mut val: u128 = 0;
    let mut saw = false;
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            if i == 0 || b[i - 1] == b'_' || i + 1 >= b.len() || b[i + 1] == b'_' {
                return None;
            }
            continue;
        }
        let v = (c as char).to_digit(radix)?;
        val = val.checked_mul(u128::from(radix))?.checked_add(u128::from(v))?;
        saw = true;
    }
    saw.then_some(val)
}

fn radix(rest: &str) -> (u32, &str) {
    for (p, r) in [("0x", 16), ("0X", 16), ("0o", 8), ("0O", 8), ("0b", 2), ("0B", 2)] {
        if let Some(d) = rest.strip_prefix(p) {
            return (r, d);
        }
    }
    (10, rest)
}

fn int_signed(s: &str) -> Option<i128> {
    let t = yaml_trim(s);
    let (neg, rest) = match t.strip_prefix('+') {
        Some(r) => (false, r),
        None => match t.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, t),
        },
    };
    let (radix, d) = radix(rest);
    if radix == 10 && d.starts_with('0') && d != "0" {
        return None;
    }
    let mag = digits(d, radix)?;
    if neg {
        if mag == (i128::MAX as u128) + 1 {
            Some(i128::MIN)
        } else {
            i128::try_from(mag).ok()?.checked_neg()
        }
    } else {
        i128::try_from(mag).ok()
    }
}

fn int_unsigned(s: &str) -> Option<u128> {
    let t = yaml_trim(s);
    if t.starts_with('-') {
        return None;
    }
    let rest = t.strip_prefix('+').unwrap_or(t);
    let (radix, d) = radix(rest);
    if radix == 10 && d.starts_with('0') && d != "0" {
        return None;
    }
    digits(d, radix)
}

/// A plain key serde-saphyr compares as an integer.
fn int_key(s: &str) -> bool {
    if !s
        .bytes()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == b'+' || c == b'-')
    {
        return false;
    }
    if yaml_trim(s).starts_with('-') {
        int_signed(s).is_some()
    } else {
        int_unsigned(s).is_some()
    }
}

fn leading_zero_decimal(t: &str) -> bool {
    let s = yaml_trim(t);
    let d = s.strip_prefix(['+', '-']).unwrap_or(s);
    match d.strip_prefix('0') {
        Some(rest) => rest
            .chars()
            .next()
            .is_some_and(|c| !matches!(c, 'x' | 'X' | 'o' | 'O' | 'b' | 'B')),
        None => false,
    }
}

fn typed_float<T: std::str::FromStr + std::ops::Neg<Output = T>>(
    s: &str,
    nan: T,
    inf: T,
    finite: fn(&T) -> bool,
) -> Option<T> {
    let t = yaml_trim(s);
    let is = |w: &str| t.eq_ignore_ascii_case(w);
    if is(".nan") || is("+.nan") || is("-.nan") {
        Some(nan)
    } else if is(".inf") || is("+.inf") {
        Some(inf)
    } else if is("-.inf") {
        Some(-inf)
    } else {
        t.parse::<T>().ok().filter(finite)
    }
}

fn float_incl_overflow(s: &str) -> Option<f64> {
    if let Some(v) = typed_float::<f64>(s, f64::NAN, f64::INFINITY, |v| v.is_finite()) {
        return Some(v);
    }
    let t = yaml_trim(s);
    let unsigned = t.strip_prefix(['+', '-']).unwrap_or(t);
    if !unsigned.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    t.parse::<f64>().ok().filter(|v| v.is_infinite())
}

#[cfg(test)]
mod tests;
