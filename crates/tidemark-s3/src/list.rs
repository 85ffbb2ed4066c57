//! ListObjects(V2) over the namespace: the files below a bucket's directory in key (byte) order,
//! grouped into common prefixes by a delimiter.
//!
//! It walks `Filer::scan` (every entry below a directory in path order, which for files is key
//! order, see `tidemark_core::path`). Directories are not keys: they are skipped, and a
//! delimiter's common prefix is emitted once, after which the walk jumps past everything that
//! starts with it (one new scan), so a listing with `/` costs about one scan per common prefix
//! and never walks a subtree it does not show.

use tidemark_core::model::{Entry, EntryKind};
use tidemark_core::{Error, Filer, Result, path};

/// Sorts after every character a key can continue with (the last scalar value): `P + JUMP`
/// is past every key that starts with `P`.
pub(crate) const JUMP: char = '\u{10FFFF}';
/// Rows per scan call.
const SCAN_PAGE: usize = 1000;
/// Rows per scan call right after a jump (the next common prefix is often close).
const SCAN_AFTER_JUMP: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Object { key: String, entry: Box<Entry> },
    Prefix(String),
}

impl Item {
    pub fn key(&self) -> &str {
        match self {
            Item::Object { key, .. } => key,
            Item::Prefix(p) => p,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub items: Vec<Item>,
    /// More items follow the last one.
    pub truncated: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Query<'a> {
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// List only keys (and prefixes) strictly after this one.
    pub after: Option<&'a str>,
    pub max: usize,
}

/// The largest string below `s` that still sorts before every string starting with `s`, as a
/// scan's exclusive lower bound; `None` when nothing sorts below.
pub(crate) fn just_before(s: &str) -> Option<String> {
    let mut chars: Vec<char> = s.chars().collect();
    let last = chars.pop()?;
    let prev = (0..last as u32).rev().find_map(char::from_u32)?;
    let mut out: String = chars.into_iter().collect();
    out.push(prev);
    out.push(JUMP);
    Some(out)
}

/// Lists bucket directory `dir` (canonical, `/buckets/B`).
pub async fn list(filer: &dyn Filer, dir: &str, q: &Query<'_>) -> Result<Listing> {
    let mut items = Vec::new();
    if q.max == 0 {
        return Ok(Listing { items, truncated: false });
    }
    // Scan the deepest directory the prefix names entirely; fewer rows to skip.
    let scan_dir = match q.prefix.rfind('/') {
        Some(i) => path::join(dir, &q.prefix[..i]),
        None => dir.to_string(),
    };
    if path::validate(&scan_dir).is_err() {
        // A prefix that is no path (`a//`, `../`) matches no key.
        return Ok(Listing { items, truncated: false });
    }
    let abs = |key: &str| format!("{dir}/{key}");
    let mut cursor: Option<String> = match q.after {
        Some(a) if a >= q.prefix => Some(match q.delimiter {
            // A cursor that is a common prefix resumes past everything under it.
            Some(d) if a.ends_with(d) => format!("{}{JUMP}", abs(a)),
            _ => abs(a),
        }),
        _ if q.prefix.is_empty() || q.prefix.ends_with('/') => None,
        _ => just_before(&abs(q.prefix)),
    };
    let mut page = SCAN_PAGE;
    loop {
        let rows = match filer.scan(&scan_dir, cursor.as_deref(), page).await {
            Ok(p) => p,
            Err(Error::NotFound { .. } | Error::NotADirectory { .. }) => break,
            Err(e) => return Err(e),
        };
        page = SCAN_PAGE;
        let exhausted = rows.next.is_none();
        let mut jumped = false;
        let mut last_path = None;
        for entry in rows.entries {
            last_path = Some(entry.path.clone());
            // A directory is a prefix; a link or a device node names no bytes to list.
            if entry.kind != EntryKind::File {
                continue;
            }
            let Some(key) = entry.path.strip_prefix(dir).and_then(|k| k.strip_prefix('/')) else { continue };
            if !key.starts_with(q.prefix) {
                if key > q.prefix {
                    // Past every key with the prefix: done.
                    return Ok(Listing { items, truncated: false });
                }
                continue;
            }
            if q.after.is_some_and(|a| key <= a) {
                continue;
            }
            let rest = &key[q.prefix.len()..];
            let item = match q.delimiter.filter(|d| !d.is_empty()).and_then(|d| rest.find(d).map(|i| (d, i))) {
                Some((d, i)) => Item::Prefix(format!("{}{}", q.prefix, &rest[..i + d.len()])),
                None => Item::Object { key: key.to_string(), entry: Box::new(entry.clone()) },
            };
            if items.len() == q.max {
                return Ok(Listing { items, truncated: true });
            }
            let jump = match &item {
                Item::Prefix(p) => Some(format!("{}{JUMP}", abs(p))),
                Item::Object { .. } => None,
            };
            items.push(item);
            if let Some(j) = jump {
                cursor = Some(j);
                page = SCAN_AFTER_JUMP;
                jumped = true;
                break;
            }
        }
        if jumped {
            continue;
        }
        if exhausted {
            break;
        }
        cursor = last_path;
    }
    Ok(Listing { items, truncated: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn just_before_sorts_below_every_extension() {
        let b = just_before("ab").unwrap();
        assert!(b.as_str() < "ab" && b.as_str() > "aa" && b.as_str() > "aaz");
        assert_eq!(just_before(""), None);
    }
}
