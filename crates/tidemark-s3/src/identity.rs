//! Who may do what through the gateway: the identities document (`s3.configure`) and the one
//! decision that reads it. Pure: no I/O, so the rules are tested on their own.
//!
//! The document lives at [`IDENTITIES`] in the namespace. An identity has a name, access keys
//! (access key id + secret), actions and, optionally, the buckets those actions are limited to.
//! The identity named `anonymous` (no keys) grants what unsigned requests may do; without it an
//! unsigned request is refused.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The identities document.
pub const IDENTITIES: &str = "/etc/tidemark/s3/identities.json";

/// The identity whose actions unsigned requests get.
pub const ANONYMOUS: &str = "anonymous";

/// The development key: accepted only while no identity is configured and only on a gateway
/// that listens on loopback (as the filer is open on loopback without `--token`).
pub const DEV_ACCESS_KEY: &str = "tidemark";
pub const DEV_SECRET_KEY: &str = "tidemark";

/// SeaweedFS's action names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Action {
    /// GetObject, HeadObject (and the source of a copy).
    Read,
    /// PutObject, CopyObject, DeleteObject(s), the multipart operations.
    Write,
    /// ListBuckets, ListObjects(V2), HeadBucket, ListMultipartUploads, ListParts.
    List,
    /// Everything, including CreateBucket and DeleteBucket.
    Admin,
}

impl Action {
    pub const ALL: [Action; 4] = [Action::Read, Action::Write, Action::List, Action::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "Read",
            Action::Write => "Write",
            Action::List => "List",
            Action::Admin => "Admin",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// The action an S3 operation needs (by its name in the S3 API). Operations not listed
    /// need `Admin`, so a new operation is never opened to everyone by accident.
    pub fn of_operation(op: &str) -> Action {
        match op {
            "GetObject" | "HeadObject" => Action::Read,
            "PutObject"
            | "PostObject"
            | "CopyObject"
            | "DeleteObject"
            | "DeleteObjects"
            | "CreateMultipartUpload"
            | "UploadPart"
            | "UploadPartCopy"
            | "CompleteMultipartUpload"
            | "AbortMultipartUpload" => Action::Write,
            "ListBuckets"
            | "ListObjects"
            | "ListObjectsV2"
            | "ListObjectVersions"
            | "HeadBucket"
            | "GetBucketLocation"
            | "ListMultipartUploads"
            | "ListParts" => Action::List,
            _ => Action::Admin,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessKey {
    pub access_key: String,
    pub secret_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub name: String,
    #[serde(default)]
    pub credentials: Vec<AccessKey>,
    #[serde(default)]
    pub actions: BTreeSet<Action>,
    /// Empty: every bucket no other identity created through S3 (see [`Identity::in_scope`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub buckets: BTreeSet<String>,
}

impl Identity {
    /// Whether `bucket` (created through S3 by identity `owner`, if it was) is this identity's
    /// to use: named in its `buckets`, or — when it names none — a bucket it created or one no
    /// identity created (made by the shell or a remote mount). A bucket another identity
    /// created is its creator's, as in S3: others reach it only by naming it.
    pub fn in_scope(&self, bucket: &str, owner: Option<&str>) -> bool {
        self.buckets.contains(bucket) || (self.buckets.is_empty() && owner.is_none_or(|o| o == self.name))
    }

    /// Whether this identity may do `action` on `bucket` with its `owner` (`None`: not about
    /// one bucket).
    pub fn allows(&self, action: Action, bucket: Option<&str>, owner: Option<&str>) -> bool {
        let in_scope = bucket.is_none_or(|b| self.in_scope(b, owner));
        in_scope && (self.actions.contains(&action) || self.actions.contains(&Action::Admin))
    }

    /// Whether `bucket` shows in this identity's ListBuckets.
    pub fn sees_bucket(&self, bucket: &str, owner: Option<&str>) -> bool {
        self.in_scope(bucket, owner)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identities {
    #[serde(default)]
    pub identities: Vec<Identity>,
}

/// Who a request is, once its signature has been checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller<'a> {
    /// Signed with a configured key.
    Identity(&'a Identity),
    /// Signed with the development key (no identity configured, loopback only).
    Dev,
    /// Unsigned, and an `anonymous` identity is configured.
    Anonymous(&'a Identity),
}

impl Caller<'_> {
    pub fn allows(&self, action: Action, bucket: Option<&str>, owner: Option<&str>) -> bool {
        match self {
            Caller::Identity(i) | Caller::Anonymous(i) => i.allows(action, bucket, owner),
            Caller::Dev => true,
        }
    }
    pub fn sees_bucket(&self, bucket: &str, owner: Option<&str>) -> bool {
        match self {
            Caller::Identity(i) | Caller::Anonymous(i) => i.sees_bucket(bucket, owner),
            Caller::Dev => true,
        }
    }
}

impl Identities {
    /// Whether any identity has a key (the gateway may then listen beyond loopback).
    pub fn has_keys(&self) -> bool {
        self.identities.iter().any(|i| !i.credentials.is_empty())
    }

    /// The secret of `access_key`; the development key only when `dev_key_allowed` and no
    /// identity has keys.
    pub fn secret_of(&self, access_key: &str, dev_key_allowed: bool) -> Option<&str> {
        if let Some(k) = self.identities.iter().flat_map(|i| i.credentials.iter()).find(|k| k.access_key == access_key)
        {
            return Some(&k.secret_key);
        }
        (dev_key_allowed && !self.has_keys() && access_key == DEV_ACCESS_KEY).then_some(DEV_SECRET_KEY)
    }

    /// The caller behind a verified access key, or behind an unsigned request (`None`).
    pub fn caller(&self, access_key: Option<&str>, dev_key_allowed: bool) -> Option<Caller<'_>> {
        match access_key {
            Some(ak) => {
                if let Some(i) = self.identities.iter().find(|i| i.credentials.iter().any(|k| k.access_key == ak)) {
                    return Some(Caller::Identity(i));
                }
                (dev_key_allowed && !self.has_keys() && ak == DEV_ACCESS_KEY).then_some(Caller::Dev)
            }
            None => self.identities.iter().find(|i| i.name == ANONYMOUS).map(Caller::Anonymous),
        }
    }

    /// The document as it may be shown: every secret masked.
    pub fn masked(&self) -> Identities {
        let mut m = self.clone();
        for k in m.identities.iter_mut().flat_map(|i| i.credentials.iter_mut()) {
            k.secret_key = mask(&k.secret_key);
        }
        m
    }

    /// Applies one `s3.configure` edit; the error says what is wrong with it.
    pub fn configure(&mut self, edit: &Edit) -> Result<String, String> {
        validate_user(&edit.user)?;
        let pos = self.identities.iter().position(|i| i.name == edit.user);
        if edit.delete {
            let Some(pos) = pos else { return Err(format!("no identity named {:?}", edit.user)) };
            let id = &mut self.identities[pos];
            let nothing_named = edit.access_key.is_none() && edit.actions.is_empty() && edit.buckets.is_empty();
            if nothing_named {
                self.identities.remove(pos);
                return Ok(format!("deleted identity {}", edit.user));
            }
            if let Some(ak) = &edit.access_key {
                let before = id.credentials.len();
                id.credentials.retain(|k| &k.access_key != ak);
                if id.credentials.len() == before {
                    return Err(format!("identity {} has no access key {ak:?}", edit.user));
                }
            }
            for a in &edit.actions {
                id.actions.remove(a);
            }
            for b in &edit.buckets {
                id.buckets.remove(b);
            }
            return Ok(format!("updated identity {}", edit.user));
        }
        if let Some(ak) = &edit.access_key
            && let Some(other) = self
                .identities
                .iter()
                .find(|i| i.name != edit.user && i.credentials.iter().any(|k| &k.access_key == ak))
        {
            return Err(format!("access key {ak:?} already belongs to identity {}", other.name));
        }
        if edit.user == ANONYMOUS && edit.access_key.is_some() {
            return Err("the anonymous identity has no keys: it is what unsigned requests may do".into());
        }
        let created = pos.is_none();
        let id = match pos {
            Some(p) => &mut self.identities[p],
            None => {
                self.identities.push(Identity {
                    name: edit.user.clone(),
                    credentials: vec![],
                    actions: BTreeSet::new(),
                    buckets: BTreeSet::new(),
                });
                self.identities.last_mut().expect("just pushed")
            }
        };
        match (&edit.access_key, &edit.secret_key) {
            (Some(ak), Some(sk)) => {
                validate_key(ak, sk)?;
                match id.credentials.iter_mut().find(|k| &k.access_key == ak) {
                    Some(k) => k.secret_key = sk.clone(),
                    None => id.credentials.push(AccessKey { access_key: ak.clone(), secret_key: sk.clone() }),
                }
            }
            (None, None) => {}
            _ => return Err("-access_key and -secret_key go together".into()),
        }
        id.actions.extend(edit.actions.iter().copied());
        id.buckets.extend(edit.buckets.iter().cloned());
        if id.actions.is_empty() {
            return Err(format!("identity {} would have no actions: add -actions=Read,Write,List,Admin", edit.user));
        }
        Ok(format!("{} identity {}", if created { "created" } else { "updated" }, edit.user))
    }
}

/// One `s3.configure` invocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edit {
    pub user: String,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub actions: Vec<Action>,
    pub buckets: Vec<String>,
    pub delete: bool,
}

/// A secret as the shell shows it: core's mask (`****` and the last 4 characters); one the
/// filer already masked (an admin token beside a cluster token, or `tidemark server` without
/// tokens) is shown as it came.
pub fn mask(secret: &str) -> String {
    if secret.starts_with("****") { secret.to_string() } else { tidemark_core::secrets::mask(secret) }
}

fn validate_user(user: &str) -> Result<(), String> {
    if user.is_empty() || user.len() > 64 || !user.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
        return Err(format!("-user={user:?}: 1 to 64 letters, digits or - _ . @"));
    }
    Ok(())
}

fn validate_key(access_key: &str, secret_key: &str) -> Result<(), String> {
    let printable = |s: &str| s.chars().all(|c| c.is_ascii_graphic());
    if !(3..=128).contains(&access_key.len()) || !printable(access_key) || access_key.contains('/') {
        return Err("-access_key: 3 to 128 printable ASCII characters, no '/' or spaces".into());
    }
    if !(8..=128).contains(&secret_key.len()) || !printable(secret_key) {
        return Err("-secret_key: 8 to 128 printable ASCII characters, no spaces".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(user: &str, ak: Option<&str>, actions: &[Action], buckets: &[&str]) -> Edit {
        Edit {
            user: user.into(),
            access_key: ak.map(Into::into),
            secret_key: ak.map(|a| format!("{a}-secret-key")),
            actions: actions.to_vec(),
            buckets: buckets.iter().map(|b| b.to_string()).collect(),
            delete: false,
        }
    }

    #[test]
    fn actions_are_scoped_to_buckets_and_admin_implies_all() {
        let mut ids = Identities::default();
        ids.configure(&edit("reader", Some("AKREAD"), &[Action::Read, Action::List], &["photos"])).unwrap();
        ids.configure(&edit("root", Some("AKROOT"), &[Action::Admin], &[])).unwrap();
        let reader = ids.caller(Some("AKREAD"), false).unwrap();
        assert!(reader.allows(Action::Read, Some("photos"), None));
        assert!(reader.allows(Action::Read, Some("photos"), Some("someone")), "named: whoever made it");
        assert!(!reader.allows(Action::Read, Some("other"), None));
        assert!(!reader.allows(Action::Write, Some("photos"), None));
        assert!(reader.sees_bucket("photos", None) && !reader.sees_bucket("other", None));
        let root = ids.caller(Some("AKROOT"), false).unwrap();
        assert!(root.allows(Action::Write, Some("anything"), None) && root.allows(Action::Admin, None, None));
        // A bucket another identity created through S3 is not in an unrestricted identity's scope.
        assert!(!root.allows(Action::Read, Some("theirs"), Some("someone-else")));
        assert!(root.allows(Action::Read, Some("mine"), Some("root")));
        assert_eq!(ids.caller(Some("unknown"), true), None, "an unknown key is nobody");
        assert_eq!(ids.caller(None, false), None, "no anonymous identity: unsigned is nobody");
    }

    #[test]
    fn the_dev_key_works_only_with_no_keys_configured_and_when_allowed() {
        let mut ids = Identities::default();
        assert_eq!(ids.secret_of(DEV_ACCESS_KEY, true), Some(DEV_SECRET_KEY));
        assert_eq!(ids.secret_of(DEV_ACCESS_KEY, false), None, "not beyond loopback");
        ids.configure(&edit(ANONYMOUS, None, &[Action::Read], &["public"])).unwrap();
        assert_eq!(ids.secret_of(DEV_ACCESS_KEY, true), Some(DEV_SECRET_KEY), "anonymous has no keys");
        assert!(matches!(ids.caller(None, true), Some(Caller::Anonymous(_))));
        ids.configure(&edit("me", Some("AKME"), &[Action::Admin], &[])).unwrap();
        assert_eq!(ids.secret_of(DEV_ACCESS_KEY, true), None, "a configured key retires the dev key");
        assert_eq!(ids.secret_of("AKME", false), Some("AKME-secret-key"));
    }

    #[test]
    fn configure_validates_and_deletes() {
        let mut ids = Identities::default();
        assert!(ids.configure(&edit("bad user", Some("AK1"), &[Action::Read], &[])).is_err());
        assert!(ids.configure(&edit("me", None, &[], &[])).unwrap_err().contains("no actions"));
        let mut e = edit("me", Some("AK1"), &[Action::Read], &[]);
        e.secret_key = Some("short".into());
        assert!(ids.configure(&e).unwrap_err().contains("secret_key"));
        ids.configure(&edit("me", Some("AK1"), &[Action::Read], &[])).unwrap();
        assert!(ids.configure(&edit("you", Some("AK1"), &[Action::Read], &[])).unwrap_err().contains("belongs"));
        assert!(ids.configure(&edit(ANONYMOUS, Some("AK9"), &[Action::Read], &[])).is_err());
        let del = Edit { user: "me".into(), access_key: Some("AK1".into()), delete: true, ..Default::default() };
        ids.configure(&del).unwrap();
        assert!(ids.identities[0].credentials.is_empty());
        ids.configure(&Edit { user: "me".into(), delete: true, ..Default::default() }).unwrap();
        assert!(ids.identities.is_empty());
        assert!(ids.configure(&Edit { user: "me".into(), delete: true, ..Default::default() }).is_err());
    }

    #[test]
    fn secrets_are_masked_and_operations_map_to_actions() {
        let mut ids = Identities::default();
        ids.configure(&edit("me", Some("AKME"), &[Action::Admin], &[])).unwrap();
        let shown = serde_json::to_string(&ids.masked()).unwrap();
        assert!(!shown.contains("AKME-secret-key") && shown.contains("****-key"), "{shown}");
        assert_eq!(Action::of_operation("GetObject"), Action::Read);
        assert_eq!(Action::of_operation("UploadPartCopy"), Action::Write);
        assert_eq!(Action::of_operation("PostObject"), Action::Write, "a browser upload form writes");
        assert_eq!(Action::of_operation("ListObjectVersions"), Action::List);
        assert_eq!(Action::of_operation("ListObjectsV2"), Action::List);
        assert_eq!(Action::of_operation("PutBucketPolicy"), Action::Admin);
        assert_eq!(Action::parse(" write "), Some(Action::Write));
    }
}
