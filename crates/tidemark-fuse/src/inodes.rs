//! The mount's memory of the namespace: inode numbers for paths, and the entries and directory
//! listings it has read, kept until the change log says they changed. Pure: no I/O.

use std::collections::HashMap;

use tidemark_core::model::{Entry, EntryKind};
use tidemark_core::path;

pub const ROOT_INO: u64 = 1;

#[derive(Debug, Default)]
pub struct Inodes {
    /// The namespace directory the mount shows at its root.
    root: String,
    by_ino: HashMap<u64, String>,
    by_path: HashMap<String, u64>,
    next: u64,
    /// Entries read from the filer (stat or listing), by path.
    entries: HashMap<String, Entry>,
    /// Directory listings read from the filer: child names, with their kinds, in order.
    dirs: HashMap<String, Vec<(String, EntryKind)>>,
    /// How many changes the mount has been told of. A read from the filer that started before
    /// one may hold what that change replaced; it is used once, not remembered.
    changes: u64,
    /// Inodes the kernel reads from a file of the filer's (FUSE passthrough).
    passed: std::collections::HashSet<u64>,
}

impl Inodes {
    pub fn new(root: &str) -> Self {
        let mut i = Inodes { root: root.to_string(), next: ROOT_INO + 1, ..Default::default() };
        i.by_ino.insert(ROOT_INO, root.to_string());
        i.by_path.insert(root.to_string(), ROOT_INO);
        i
    }

    /// The inode of `p`, assigned on first sight. Numbers are never reused while mounted.
    pub fn ino(&mut self, p: &str) -> u64 {
        if let Some(i) = self.by_path.get(p) {
            return *i;
        }
        let i = self.next;
        self.next += 1;
        self.by_ino.insert(i, p.to_string());
        self.by_path.insert(p.to_string(), i);
        i
    }

    pub fn known_ino(&self, p: &str) -> Option<u64> {
        self.by_path.get(p).copied()
    }

    pub fn path(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).map(String::as_str)
    }

    /// The path of `name` in directory `parent`.
    pub fn child(&self, parent: u64, name: &str) -> Option<String> {
        self.path(parent).map(|d| path::join(d, name))
    }

    pub fn entry(&self, p: &str) -> Option<&Entry> {
        self.entries.get(p)
    }

    pub fn remember(&mut self, e: Entry) {
        self.entries.insert(e.path.clone(), e);
    }

    pub fn listing(&self, dir: &str) -> Option<&[(String, EntryKind)]> {
        self.dirs.get(dir).map(Vec::as_slice)
    }

    /// Where the change count stands: take it before asking the filer, give it to the
    /// `*_since` calls after.
    pub fn epoch(&self) -> u64 {
        self.changes
    }

    /// Remembers `e`, read from the filer since `epoch`, unless a change arrived meanwhile (the
    /// answer may predate it, and nothing would ever forget it).
    pub fn remember_since(&mut self, e: Entry, epoch: u64) {
        if self.changes == epoch {
            self.remember(e);
        }
    }

    /// [`remember_listing`](Self::remember_listing) under the same rule.
    pub fn remember_listing_since(&mut self, dir: &str, children: Vec<Entry>, epoch: u64) {
        if self.changes == epoch {
            self.remember_listing(dir, children);
        }
    }

    pub fn remember_listing(&mut self, dir: &str, children: Vec<Entry>) {
        let names = children.iter().map(|e| (e.name().to_string(), e.kind)).collect();
        // A name of a hard-linked file is remembered as its file, by a stat of the name.
        for e in children.into_iter().filter(|e| e.posix.inode.is_none()) {
            self.remember(e);
        }
        self.dirs.insert(dir.to_string(), names);
    }

    /// Forgets the entry read of `p` (its listing stays): after a change the mount made to it
    /// whose record has not arrived yet.
    pub fn forget_entry(&mut self, p: &str) {
        self.changes += 1;
        self.entries.remove(p);
    }

    /// Marks inode `ino` as read from a file of the filer's (or no longer).
    pub fn passed(&mut self, ino: u64, on: bool) {
        if on {
            self.passed.insert(ino);
        } else {
            self.passed.remove(&ino);
        }
    }

    /// Forgets what was read of `p` (and, for a directory, of its listing), and of its parent's
    /// listing. Returns the inodes the kernel should forget too: `(parent, name)` for its entry,
    /// and `p`'s own inode for its attributes and pages.
    ///
    /// A path whose inode is being read from a file of the filer's gets a new inode: the kernel
    /// reads every open of an inode from the one file, so the new version needs an inode of its
    /// own (as a file replaced by a rename has); the open handles keep reading the version they
    /// opened.
    pub fn changed(&mut self, p: &str) -> (Option<(u64, String)>, Option<u64>) {
        let renumbered = self.known_ino(p).filter(|i| self.passed.contains(i));
        if renumbered.is_some() {
            // The next lookup of the name assigns a new number; handles keep the old.
            self.by_path.remove(p);
        }
        self.changes += 1;
        self.entries.remove(p);
        self.dirs.remove(p);
        let parent = path::parent(p).map(str::to_string);
        if let Some(d) = &parent {
            self.dirs.remove(d);
        }
        let entry = parent.and_then(|d| self.known_ino(&d).map(|i| (i, path::name(p).to_string())));
        (entry, renumbered.or_else(|| self.known_ino(p)))
    }

    /// After `from` was renamed to `to`: the kernel now knows `from`'s inode — and, for a
    /// directory, the inodes of everything below it — by the new names, so those inodes must
    /// name the new paths; an inode that named `to` before names nothing. What was read of the
    /// old paths is forgotten.
    pub fn renamed(&mut self, from: &str, to: &str) {
        if let Some(old) = self.by_path.remove(to) {
            self.by_ino.remove(&old);
        }
        let prefix = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| *p == from || p.starts_with(&prefix))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, ino) in moved {
            self.by_path.remove(&p);
            let new = format!("{to}{}", &p[from.len()..]);
            self.by_ino.insert(ino, new.clone());
            self.by_path.insert(new, ino);
        }
        self.entries.retain(|p, _| !(p.starts_with(&prefix)));
        self.dirs.retain(|p, _| !(p.starts_with(&prefix)));
        self.changed(from);
        self.changed(to);
    }

    /// Whether `p` is shown by this mount (the root or below it, or a hard-linked file's inode entry).
    pub fn shows(&self, p: &str) -> bool {
        // The inode entries of hard-linked files are what the names below the root show.
        path::is_within(p, &self.root) || path::is_within(p, tidemark_core::model::INODES_DIR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::model::{Content, EntryKind};

    fn entry(p: &str) -> Entry {
        Entry {
            path: p.into(),
            kind: EntryKind::File,
            size: 1,
            mtime_ms: 0,
            mode: 0o644,
            version: 1,
            remote: None,
            content: Content::Inline,
            extended: Default::default(),
            posix: Default::default(),
        }
    }

    #[test]
    fn a_renamed_directory_takes_the_inodes_below_it() {
        let mut i = Inodes::new("/");
        let (d, f, other) = (i.ino("/a"), i.ino("/a/b/f"), i.ino("/ab"));
        let replaced = i.ino("/z");
        i.remember(entry("/a/b/f"));
        i.renamed("/a", "/z");
        assert_eq!((i.path(d), i.path(f), i.path(other)), (Some("/z"), Some("/z/b/f"), Some("/ab")));
        assert_eq!(i.path(replaced), None);
        assert_eq!(i.known_ino("/a/b/f"), None);
        assert!(i.entry("/a/b/f").is_none());
    }

    /// A new version of a file read from the filer's file gets an inode of its own; the old
    /// number still names the path for the handles that hold it.
    #[test]
    fn a_changed_file_read_through_passthrough_gets_a_new_inode() {
        let mut i = Inodes::new("/m");
        let (a, b) = (i.ino("/m/a"), i.ino("/m/b"));
        i.passed(a, true);
        assert_eq!(i.changed("/m/a"), (Some((ROOT_INO, "a".to_string())), Some(a)));
        let a2 = i.ino("/m/a");
        assert!(a2 != a && i.path(a) == Some("/m/a") && i.path(a2) == Some("/m/a"));
        assert_eq!(i.changed("/m/b").1, Some(b));
        assert_eq!(i.ino("/m/b"), b, "not passed through: the same inode");
        i.passed(a, false);
        i.changed("/m/a");
        assert_eq!(i.ino("/m/a"), a2);
    }

    #[test]
    fn a_read_that_a_change_overtook_is_not_remembered() {
        let mut i = Inodes::new("/m");
        // A listing asked for, then the change log says /m/a is gone, then the (older) answer.
        let epoch = i.epoch();
        i.changed("/m/a");
        i.remember_listing_since("/m", vec![entry("/m/a"), entry("/m/b")], epoch);
        i.remember_since(entry("/m/a"), epoch);
        assert!(i.listing("/m").is_none() && i.entry("/m/a").is_none(), "asked again next time");
        // No change meanwhile: remembered.
        let epoch = i.epoch();
        i.remember_listing_since("/m", vec![entry("/m/b")], epoch);
        assert_eq!(i.listing("/m"), Some(&[("b".to_string(), EntryKind::File)][..]));
    }

    #[test]
    fn inodes_are_stable_and_a_change_forgets_the_entry_and_its_parents_listing() {
        let mut i = Inodes::new("/m");
        assert_eq!(i.ino("/m"), ROOT_INO);
        let a = i.ino("/m/a");
        assert_eq!(i.ino("/m/a"), a);
        assert_eq!(i.path(a), Some("/m/a"));
        assert_eq!(i.child(ROOT_INO, "b").as_deref(), Some("/m/b"));
        i.remember_listing("/m", vec![entry("/m/a"), entry("/m/b")]);
        assert_eq!(
            i.listing("/m"),
            Some(&[("a".to_string(), EntryKind::File), ("b".to_string(), EntryKind::File)][..])
        );
        assert!(i.entry("/m/b").is_some());
        let (parent, own) = i.changed("/m/b");
        assert_eq!(parent, Some((ROOT_INO, "b".to_string())));
        assert_eq!(own, None, "never looked up: no inode to forget");
        assert!(i.listing("/m").is_none() && i.entry("/m/b").is_none() && i.entry("/m/a").is_some());
        assert!(i.shows("/m/x/y") && !i.shows("/mm/x"));
        // A rename moves the inode to the new name; the replaced name's inode names nothing.
        let lock = i.ino("/m/config.lock");
        let config = i.ino("/m/config");
        i.renamed("/m/config.lock", "/m/config");
        assert_eq!(i.path(lock), Some("/m/config"));
        assert_eq!(i.path(config), None);
        assert_eq!(i.known_ino("/m/config.lock"), None);
        assert_eq!(i.ino("/m/config"), lock);
    }
}
