//! The Wan pipelines' prompt cleaning (diffusers 0.42.1 `pipeline_wan.py`
//! `prompt_clean`) without ftfy: Python's `html.unescape` twice, strip, every run of
//! whitespace to one space, strip.
//!
//! "Whitespace" is Python's `str.isspace` (Unicode White_Space plus U+001C–U+001F), and
//! `unescape` follows CPython 3.11's `html.unescape` exactly: the HTML5 named references
//! (with the longest-prefix rule for names without `;`), decimal and hex references, and
//! the table of invalid references. ftfy is not applied: it is optional in diffusers and
//! absent from the reference environment the goldens were made in.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Cleans a prompt the way the Wan pipelines do before tokenising it.
pub fn prompt_clean(text: &str) -> String {
    let once = html_unescape(&html_unescape(text));
    collapse_whitespace(once.trim_matches(is_python_space))
}

/// Python's `str.isspace` for one character.
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `re.sub(r"\s+", " ", text).strip()`.
fn collapse_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if is_python_space(c) {
            in_space = true;
        } else {
            if in_space && !out.is_empty() {
                out.push(' ');
            }
            in_space = false;
            out.push(c);
        }
    }
    out
}

/// HTML5 named references without the leading `&` (`"amp;"`, `"amp"`, …).
fn named_references() -> &'static HashMap<&'static str, &'static str> {
    static TABLE: OnceLock<HashMap<&'static str, &'static str>> = OnceLock::new();
    TABLE.get_or_init(|| {
        entities::ENTITIES
            .iter()
            .map(|e| (e.entity.trim_start_matches('&'), e.characters))
            .collect()
    })
}

/// Code points a numeric reference to which yields nothing (CPython's
/// `html._invalid_codepoints`, less those `_invalid_charrefs` maps first).
fn is_invalid_codepoint(n: u32) -> bool {
    matches!(n, 0x1..=0x8 | 0xb | 0xe..=0x1f | 0x7f..=0x9f | 0xfdd0..=0xfdef)
        || (n & 0xfffe) == 0xfffe
}

/// What CPython's `_invalid_charrefs` maps a numeric reference to, if anything.
fn invalid_charref(n: u32) -> Option<&'static str> {
    Some(match n {
        0x00 => "\u{fffd}",
        0x0d => "\r",
        0x80 => "\u{20ac}",
        0x81 => "\u{81}",
        0x82 => "\u{201a}",
        0x83 => "\u{0192}",
        0x84 => "\u{201e}",
        0x85 => "\u{2026}",
        0x86 => "\u{2020}",
        0x87 => "\u{2021}",
        0x88 => "\u{02c6}",
        0x89 => "\u{2030}",
        0x8a => "\u{0160}",
        0x8b => "\u{2039}",
        0x8c => "\u{0152}",
        0x8d => "\u{8d}",
        0x8e => "\u{017d}",
        0x8f => "\u{8f}",
        0x90 => "\u{90}",
        0x91 => "\u{2018}",
        0x92 => "\u{2019}",
        0x93 => "\u{201c}",
        0x94 => "\u{201d}",
        0x95 => "\u{2022}",
        0x96 => "\u{2013}",
        0x97 => "\u{2014}",
        0x98 => "\u{02dc}",
        0x99 => "\u{2122}",
        0x9a => "\u{0161}",
        0x9b => "\u{203a}",
        0x9c => "\u{0153}",
        0x9d => "\u{9d}",
        0x9e => "\u{017e}",
        0x9f => "\u{0178}",
        _ => return None,
    })
}

/// The text of numeric reference value `n` (saturated: anything past U+10FFFF is
/// replaced like CPython's big integers are).
fn numeric_reference(n: u32, out: &mut String) {
    if let Some(s) = invalid_charref(n) {
        out.push_str(s);
    } else if (0xd800..=0xdfff).contains(&n) || n > 0x10ffff {
        out.push('\u{fffd}');
    } else if !is_invalid_codepoint(n) {
        if let Some(c) = char::from_u32(n) {
            out.push(c);
        }
    }
}

/// Parses the digits of a numeric reference, saturating at `u32::MAX`.
fn parse_saturating(digits: &str, radix: u32) -> u32 {
    digits.chars().fold(0u32, |acc, c| {
        let d = c.to_digit(radix).unwrap_or(0);
        acc.saturating_mul(radix).saturating_add(d)
    })
}

/// CPython 3.11's `html.unescape`: replaces every match of
/// `&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)`.
pub fn html_unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match unescape_one(after, &mut out) {
            Some(consumed) => rest = &after[consumed..],
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Replaces one reference starting right after a `&`; returns the bytes of `after` it
/// consumed, or `None` when no reference starts there.
fn unescape_one(after: &str, out: &mut String) -> Option<usize> {
    let semicolon = |end: usize| usize::from(after[end..].starts_with(';'));
    if let Some(num) = after.strip_prefix('#') {
        let (digits, radix, skip) = match num.strip_prefix(['x', 'X']) {
            Some(hex) => (hex, 16, 2),
            None => (num, 10, 1),
        };
        let len = digits
            .bytes()
            .take_while(|b| match radix {
                16 => b.is_ascii_hexdigit(),
                _ => b.is_ascii_digit(),
            })
            .count();
        if len == 0 {
            return None;
        }
        numeric_reference(parse_saturating(&digits[..len], radix), out);
        let end = skip + len;
        return Some(end + semicolon(end));
    }
    // A name: up to 32 characters that are not \t \n \f space < & # ;.
    let name_end = after
        .char_indices()
        .take(32)
        .find(|&(_, c)| matches!(c, '\t' | '\n' | '\x0c' | ' ' | '<' | '&' | '#' | ';'))
        .map(|(i, _)| i)
        .unwrap_or_else(|| after.char_indices().nth(32).map_or(after.len(), |(i, _)| i));
    if name_end == 0 {
        return None;
    }
    let end = name_end + semicolon(name_end);
    let name = &after[..end];
    let table = named_references();
    if let Some(chars) = table.get(name) {
        out.push_str(chars);
        return Some(end);
    }
    // The longest prefix (at least 2 characters) that is a known name, the rest kept.
    let bounds: Vec<usize> = name.char_indices().map(|(i, _)| i).skip(2).collect();
    for &cut in bounds.iter().rev() {
        if let Some(chars) = table.get(&name[..cut]) {
            out.push_str(chars);
            out.push_str(&name[cut..]);
            return Some(end);
        }
    }
    out.push('&');
    out.push_str(name);
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_matches_cpython() {
        // Expected values from CPython 3.11's html.unescape.
        let cases = [
            ("fish &amp; chips", "fish & chips"),
            ("&lt;3 &gt", "<3 >"),
            ("caf&eacute; caf&eacute", "café café"),
            ("&amp;amp;", "&amp;"),
            ("&#65;&#x42;&#X43", "ABC"),
            ("&#128; &#x81;", "\u{20ac} \u{81}"),
            ("&#0; &#xD800; &#99999999999;", "\u{fffd} \u{fffd} \u{fffd}"),
            ("&#1;&#xFFFE;x", "x"),
            ("&notit; &notin;", "¬it; ∉"),
            ("&unknown; & &; &#; &#x;", "&unknown; & &; &#; &#x;"),
            ("&ampfoo", "&foo"),
            ("&NotEqualTilde;", "\u{2242}\u{338}"),
        ];
        for (input, expected) in cases {
            assert_eq!(html_unescape(input), expected, "{input:?}");
        }
    }

    #[test]
    fn cleaning_collapses_python_whitespace() {
        assert_eq!(
            prompt_clean("  a red car\n\tdrives   along\u{a0}the road\u{1c} "),
            "a red car drives along the road"
        );
        assert_eq!(prompt_clean("   "), "");
        assert_eq!(prompt_clean("&amp;amp;"), "&");
        assert_eq!(prompt_clean("a&nbsp;&nbsp;b"), "a b");
    }
}
