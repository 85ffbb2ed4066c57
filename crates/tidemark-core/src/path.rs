//! Namespace paths. A path is absolute, `/`-separated, and canonical: no empty, `.` or `..`
//! segments, no trailing `/` (except the root `/`), no NUL, each name at most [`MAX_NAME_BYTES`]
//! bytes and the whole at most [`MAX_PATH_BYTES`]. Canonical paths make the store's byte order
//! of paths equal the byte order of the keys they mirror, which the reconcile's merge-join needs.

use crate::error::{Error, Result};

pub const ROOT: &str = "/";
pub const MAX_NAME_BYTES: usize = 255;
pub const MAX_PATH_BYTES: usize = 4096;

/// `s` as it may be printed to a terminal or a log line: control characters (a name may hold
/// any but `/` and NUL; escape sequences would drive the terminal, a newline would forge a line)
/// become `\xHH` / `\u{HHHH}`, and a backslash becomes `\\` only when something was escaped,
/// so ordinary names print as they are.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x100 && c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Why a path (or a segment of a key) is not acceptable. Also used by the key mapping.
pub fn segment_problem(segment: &str) -> Option<&'static str> {
    if segment.is_empty() {
        Some("empty segment (`//`)")
    } else if segment == "." || segment == ".." {
        Some("`.` or `..` segment")
    } else if segment.contains('\0') {
        Some("NUL byte")
    } else if segment.len() > MAX_NAME_BYTES {
        Some("a name longer than 255 bytes")
    } else {
        None
    }
}

/// Checks that `path` is canonical; the error names the problem.
pub fn validate(path: &str) -> Result<()> {
    let invalid = |reason: &str| Error::InvalidPath { path: path.to_string(), reason: reason.to_string() };
    if !path.starts_with('/') {
        return Err(invalid("must be absolute (start with `/`)"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(invalid("longer than 4096 bytes"));
    }
    if path == ROOT {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(invalid("trailing `/`"));
    }
    for segment in path[1..].split('/') {
        if let Some(reason) = segment_problem(segment) {
            return Err(invalid(reason));
        }
    }
    Ok(())
}

/// Accepts what a person types (`/docs/`, `docs` is rejected) and returns the canonical form.
pub fn normalize_user_path(input: &str) -> Result<String> {
    let trimmed = if input.len() > 1 { input.trim_end_matches('/') } else { input };
    let path = if trimmed.is_empty() { ROOT } else { trimmed };
    validate(path)?;
    Ok(path.to_string())
}

/// The parent directory of a canonical path; `None` for the root.
pub fn parent(path: &str) -> Option<&str> {
    if path == ROOT {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some(ROOT),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

/// The last segment of a canonical path (`""` for the root).
pub fn name(path: &str) -> &str {
    path.rfind('/').map_or(path, |i| &path[i + 1..])
}

/// `dir` joined with a relative, `/`-separated tail.
pub fn join(dir: &str, tail: &str) -> String {
    if dir == ROOT { format!("/{tail}") } else { format!("{dir}/{tail}") }
}

/// The proper ancestors of a canonical path, nearest the root first, root excluded.
pub fn ancestors(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut cur = parent(path);
    while let Some(p) = cur {
        if p == ROOT {
            break;
        }
        out.push(p);
        cur = parent(p);
    }
    out.reverse();
    out
}

/// Whether `path` is `dir` itself or lies below it.
pub fn is_within(path: &str, dir: &str) -> bool {
    dir == ROOT || path == dir || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
}

/// The half-open byte range `(lower, upper)` of the paths strictly below `dir`: every descendant
/// `p` satisfies `lower <= p < upper` (and `p != dir`). `0` is the byte after `/`, so the range
/// is exactly the set of strings that start with `dir + "/"`.
pub fn descendant_bounds(dir: &str) -> (String, String) {
    if dir == ROOT { ("/".to_string(), "0".to_string()) } else { (format!("{dir}/"), format!("{dir}0")) }
}

/// The exclusive bounds `(lo, hi)` of a range read of the entries strictly below `dir` whose
/// path is greater than `start_after`: `lo < path < hi`. One lower bound, so a database can seek
/// straight to the page. (No canonical path equals `dir/`, and the root's own path `/` is the
/// root's `lo`, so the directory itself is never in the range.)
pub fn scan_bounds(dir: &str, start_after: &str) -> (String, String) {
    let (lo, hi) = descendant_bounds(dir);
    if start_after > lo.as_str() { (start_after.to_string(), hi) } else { (lo, hi) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_print_without_driving_the_terminal() {
        assert_eq!(printable("plain name.txt"), "plain name.txt");
        assert_eq!(printable("a\\b"), "a\\b", "nothing to escape: as is");
        assert_eq!(printable("evil\x1b]0;pwned\x07\n.txt"), "evil\\x1b]0;pwned\\x07\\x0a.txt");
        assert_eq!(printable("c1\u{9b}31m\\"), "c1\\x9b31m\\\\");
        assert!(!printable("\x7f\r").chars().any(char::is_control));
    }

    #[test]
    fn validate_accepts_canonical_and_names_the_problem_otherwise() {
        for ok in ["/", "/a", "/a/b c/+%/ü", "/a-b/a0"] {
            validate(ok).unwrap();
        }
        for (bad, why) in [
            ("a", "absolute"),
            ("/a/", "trailing"),
            ("/a//b", "empty"),
            ("/a/./b", "`.`"),
            ("/a/..", "`..`"),
            ("/a\0b", "NUL"),
        ] {
            let err = validate(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert!(validate(&format!("/{}", "x".repeat(256))).is_err());
        assert!(validate(&"/abcdefgh".repeat(600)).is_err());
    }

    #[test]
    fn parent_name_ancestors() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(name("/a/b"), "b");
        assert_eq!(ancestors("/a/b/c"), vec!["/a", "/a/b"]);
        assert!(ancestors("/a").is_empty());
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/m", "x/y"), "/m/x/y");
    }

    #[test]
    fn within_and_bounds() {
        assert!(is_within("/a/b", "/a"));
        assert!(is_within("/a", "/a"));
        assert!(!is_within("/ab", "/a"));
        assert!(is_within("/x", "/"));
        let (lo, hi) = descendant_bounds("/a");
        for inside in ["/a/", "/a/b", "/a/\u{10ffff}"] {
            assert!(lo.as_str() <= inside && inside < hi.as_str());
        }
        for outside in ["/a", "/a-b", "/a0", "/b"] {
            assert!(!(lo.as_str() <= outside && outside < hi.as_str()), "{outside}");
        }
    }

    #[test]
    fn user_paths_are_normalised() {
        assert_eq!(normalize_user_path("/docs/").unwrap(), "/docs");
        assert_eq!(normalize_user_path("/").unwrap(), "/");
        assert!(normalize_user_path("docs").is_err());
    }
}
