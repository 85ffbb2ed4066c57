//! ACLs, honoured: canned ones (`public-read` lets unsigned requests read an object's bytes or
//! a bucket's listing, `public-read-write` on a bucket lets them write its objects too,
//! `authenticated-read` lets every configured identity read) and grants to identities and
//! groups (`x-amz-grant-*`, an `AccessControlPolicy` document): `READ`, `WRITE`, `READ_ACP`,
//! `WRITE_ACP`, `FULL_CONTROL` to an identity by name (its canonical id), to everyone
//! (`AllUsers`) or to every identity (`AuthenticatedUsers`). Kept as `s3.acl` in the bucket's or
//! the object's entry: a canned ACL's name, or the grants as JSON. Grants by e-mail address are
//! refused (`UnresolvableGrantByEmailAddress`): identities have no e-mail address here. Pure: no
//! I/O.

use s3s::dto::{AccessControlPolicy, Grant, Grantee, Owner, Permission, Type};
use s3s::{S3Error, S3ErrorCode, S3Result};
use serde::{Deserialize, Serialize};

pub const ATTR_ACL: &str = "s3.acl";

const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
const AUTHENTICATED_USERS: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canned {
    Private,
    PublicRead,
    PublicReadWrite,
    AuthenticatedRead,
    /// Object ACLs naming the bucket's owner: here every object's owner is the bucket's.
    BucketOwnerRead,
    BucketOwnerFullControl,
}

impl Canned {
    pub fn parse(s: &str) -> S3Result<Canned> {
        Ok(match s {
            "private" => Canned::Private,
            "public-read" => Canned::PublicRead,
            "public-read-write" => Canned::PublicReadWrite,
            "authenticated-read" => Canned::AuthenticatedRead,
            "bucket-owner-read" => Canned::BucketOwnerRead,
            "bucket-owner-full-control" => Canned::BucketOwnerFullControl,
            other => {
                return Err(S3Error::with_message(
                    S3ErrorCode::NotImplemented,
                    format!(
                        "the canned ACL {other:?} is not kept here (private, public-read, public-read-write, authenticated-read, bucket-owner-read, bucket-owner-full-control are)"
                    ),
                ));
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Canned::Private => "private",
            Canned::PublicRead => "public-read",
            Canned::PublicReadWrite => "public-read-write",
            Canned::AuthenticatedRead => "authenticated-read",
            Canned::BucketOwnerRead => "bucket-owner-read",
            Canned::BucketOwnerFullControl => "bucket-owner-full-control",
        }
    }

    /// What it lets an unsigned request do: read, and write.
    pub fn anonymous(self) -> (bool, bool) {
        match self {
            Canned::PublicRead => (true, false),
            Canned::PublicReadWrite => (true, true),
            _ => (false, false),
        }
    }

    /// Whether it lets any configured identity read.
    pub fn authenticated_read(self) -> bool {
        matches!(self, Canned::PublicRead | Canned::PublicReadWrite | Canned::AuthenticatedRead)
    }
}

/// What a grant permits, on a bucket or an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Perm {
    /// An object's bytes; a bucket's listing.
    Read,
    /// A bucket's objects: put, overwrite, delete.
    Write,
    ReadAcp,
    WriteAcp,
    FullControl,
}

impl Perm {
    pub const ALL: [Perm; 5] = [Perm::Read, Perm::Write, Perm::ReadAcp, Perm::WriteAcp, Perm::FullControl];

    pub fn as_str(self) -> &'static str {
        match self {
            Perm::Read => Permission::READ,
            Perm::Write => Permission::WRITE,
            Perm::ReadAcp => Permission::READ_ACP,
            Perm::WriteAcp => Permission::WRITE_ACP,
            Perm::FullControl => Permission::FULL_CONTROL,
        }
    }

    fn parse(s: &str) -> S3Result<Perm> {
        Perm::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| {
            S3Error::with_message(
                S3ErrorCode::MalformedACLError,
                format!("the permission {s:?}: READ, WRITE, READ_ACP, WRITE_ACP or FULL_CONTROL"),
            )
        })
    }

    /// Whether a grant of `self` permits `want`.
    pub fn covers(self, want: Perm) -> bool {
        self == want || self == Perm::FullControl
    }
}

/// Who a grant is to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Who {
    /// An identity, by its name (its canonical id).
    Identity(String),
    /// Everyone, signed or not.
    AllUsers,
    /// Every identity (a signed request).
    AuthenticatedUsers,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Granted {
    pub to: Who,
    pub perm: Perm,
}

/// An entry's ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acl {
    Canned(Canned),
    /// Exactly these grants (the owner keeps its rights to the ACL whatever they say).
    Grants(Vec<Granted>),
}

/// Who asks: a signed request, by an identity (its name) or not; or an unsigned one.
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    pub signed: bool,
    pub identity: Option<&'a str>,
}

impl Acl {
    /// The ACL kept in an entry's attributes (none: private).
    pub fn of(ext: &std::collections::BTreeMap<String, String>) -> Acl {
        match ext.get(ATTR_ACL) {
            Some(s) if s.starts_with('[') => {
                serde_json::from_str(s).map(Acl::Grants).unwrap_or(Acl::Canned(Canned::Private))
            }
            Some(s) => Acl::Canned(Canned::parse(s).unwrap_or(Canned::Private)),
            None => Acl::Canned(Canned::Private),
        }
    }

    /// What is kept in `s3.acl` (`None`: private, nothing kept).
    pub fn to_attr(&self) -> Option<String> {
        match self {
            Acl::Canned(Canned::Private) => None,
            Acl::Canned(c) => Some(c.as_str().to_string()),
            Acl::Grants(g) => serde_json::to_string(g).ok(),
        }
    }

    pub fn canned(&self) -> Option<Canned> {
        match self {
            Acl::Canned(c) => Some(*c),
            Acl::Grants(_) => None,
        }
    }

    pub fn is_private(&self) -> bool {
        matches!(self, Acl::Canned(Canned::Private))
    }

    /// Whether it grants anything to a group (everyone, or every identity): what a public
    /// access block's `BlockPublicAcls` refuses.
    pub fn is_public(&self) -> bool {
        match self {
            Acl::Canned(c) => c.authenticated_read(),
            Acl::Grants(g) => g.iter().any(|g| !matches!(g.to, Who::Identity(_))),
        }
    }

    /// The grants, as kept or as a canned ACL means them (`owner`: the entry's owner;
    /// `bucket_owner`: its bucket's, which the `bucket-owner-*` ACLs name).
    pub fn granted(&self, owner: &str, bucket_owner: &str) -> Vec<Granted> {
        let g = |to: Who, perm| Granted { to, perm };
        let mine = g(Who::Identity(owner.to_string()), Perm::FullControl);
        match self {
            Acl::Grants(all) => all.clone(),
            Acl::Canned(c) => match c {
                Canned::PublicRead => vec![g(Who::AllUsers, Perm::Read), mine],
                Canned::PublicReadWrite => vec![g(Who::AllUsers, Perm::Read), g(Who::AllUsers, Perm::Write), mine],
                Canned::AuthenticatedRead => vec![g(Who::AuthenticatedUsers, Perm::Read), mine],
                Canned::BucketOwnerRead if bucket_owner != owner => {
                    vec![mine, g(Who::Identity(bucket_owner.to_string()), Perm::Read)]
                }
                Canned::BucketOwnerFullControl if bucket_owner != owner => {
                    vec![mine, g(Who::Identity(bucket_owner.to_string()), Perm::FullControl)]
                }
                _ => vec![mine],
            },
        }
    }

    /// Whether it lets `asker` do what `want` permits. A canned ACL's grants to the owners are
    /// shown, not honoured: who owns what is no access grant here (identities and their
    /// buckets say what an owner may do); grants given explicitly are honoured, each.
    pub fn allows(&self, asker: Asker<'_>, want: Perm) -> bool {
        let granted = match self {
            Acl::Canned(_) => self.granted("", "").into_iter().filter(|g| !matches!(g.to, Who::Identity(_))).collect(),
            Acl::Grants(g) => g.clone(),
        };
        granted.iter().any(|g| {
            g.perm.covers(want)
                && match &g.to {
                    Who::AllUsers => true,
                    Who::AuthenticatedUsers => asker.signed,
                    Who::Identity(n) => asker.identity == Some(n.as_str()),
                }
        })
    }

    /// The grants as S3 shows them: the groups' first (the order ceph/s3-tests expects).
    pub fn grants(&self, owner: &Owner, bucket_owner: &str) -> Vec<Grant> {
        let owner_id = owner.id.as_deref().unwrap_or_default();
        let mut g = self.granted(owner_id, bucket_owner);
        g.sort_by_key(|g| matches!(g.to, Who::Identity(_)));
        g.into_iter().map(shown).collect()
    }
}

fn shown(g: Granted) -> Grant {
    let grantee = match g.to {
        Who::Identity(n) => Grantee {
            display_name: Some(n.clone()),
            email_address: None,
            id: Some(n),
            type_: Type::from(Type::CANONICAL_USER.to_string()),
            uri: None,
        },
        Who::AllUsers | Who::AuthenticatedUsers => Grantee {
            display_name: None,
            email_address: None,
            id: None,
            type_: Type::from(Type::GROUP.to_string()),
            uri: Some(if g.to == Who::AllUsers { ALL_USERS } else { AUTHENTICATED_USERS }.to_string()),
        },
    };
    Grant { grantee: Some(grantee), permission: Some(Permission::from(g.perm.as_str().to_string())) }
}

fn unresolvable(email: &str) -> S3Error {
    let mut e = S3Error::with_message(
        S3ErrorCode::Custom("UnresolvableGrantByEmailAddress".into()),
        format!(
            "the e-mail address {email:?} names no identity here (identities have names, not e-mail addresses: grant to id=\"NAME\")"
        ),
    );
    e.set_status_code(hyper::StatusCode::BAD_REQUEST);
    e
}

fn malformed(what: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedACLError, what.to_string())
}

/// The grantees of one `x-amz-grant-*` header: `id="NAME"`, `uri="GROUP"` or
/// `emailAddress="ADDRESS"`, separated by commas (the quotes optional).
fn header_grantees(value: &str) -> S3Result<Vec<Who>> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (kind, v) = part
            .split_once('=')
            .ok_or_else(|| malformed(format!("the grantee {part:?}: id=, uri= or emailAddress=")))?;
        let v = v.trim().trim_matches('"');
        out.push(match kind.trim() {
            "id" => Who::Identity(v.to_string()),
            "uri" => group(v)?,
            "emailAddress" => return Err(unresolvable(v)),
            other => return Err(malformed(format!("the grantee type {other:?}: id, uri or emailAddress"))),
        });
    }
    Ok(out)
}

fn group(uri: &str) -> S3Result<Who> {
    match uri {
        ALL_USERS => Ok(Who::AllUsers),
        AUTHENTICATED_USERS => Ok(Who::AuthenticatedUsers),
        other => Err(malformed(format!("the group {other:?}: {ALL_USERS} or {AUTHENTICATED_USERS}"))),
    }
}

/// The grants of a request's `x-amz-grant-*` headers, by permission (`None` where a header is
/// absent); `None` when there is none.
pub fn from_headers(
    read: Option<&str>,
    write: Option<&str>,
    read_acp: Option<&str>,
    write_acp: Option<&str>,
    full: Option<&str>,
) -> S3Result<Option<Vec<Granted>>> {
    let mut out = Vec::new();
    let mut any = false;
    for (v, perm) in [
        (read, Perm::Read),
        (write, Perm::Write),
        (read_acp, Perm::ReadAcp),
        (write_acp, Perm::WriteAcp),
        (full, Perm::FullControl),
    ] {
        if let Some(v) = v {
            any = true;
            out.extend(header_grantees(v)?.into_iter().map(|to| Granted { to, perm }));
        }
    }
    Ok(any.then_some(out))
}

/// The grants of an `AccessControlPolicy` document.
pub fn from_policy(p: &AccessControlPolicy) -> S3Result<Vec<Granted>> {
    let mut out = Vec::new();
    for g in p.grants.iter().flatten() {
        let grantee = g.grantee.as_ref().ok_or_else(|| malformed("a grant without a Grantee"))?;
        let perm =
            Perm::parse(g.permission.as_ref().ok_or_else(|| malformed("a grant without a Permission"))?.as_str())?;
        let to = match grantee.type_.as_str() {
            Type::CANONICAL_USER => {
                Who::Identity(grantee.id.clone().ok_or_else(|| malformed("a CanonicalUser grantee without an ID"))?)
            }
            Type::GROUP => group(grantee.uri.as_deref().unwrap_or_default())?,
            Type::AMAZON_CUSTOMER_BY_EMAIL => {
                return Err(unresolvable(grantee.email_address.as_deref().unwrap_or_default()));
            }
            other => {
                return Err(malformed(format!(
                    "the grantee type {other:?}: CanonicalUser, Group or AmazonCustomerByEmail"
                )));
            }
        };
        out.push(Granted { to, perm });
    }
    Ok(out)
}

/// The ACL a request asks for: a canned one, grants in headers, or a policy document — at most
/// one of them (`None`: none).
pub fn asked(
    canned: Option<Canned>,
    headers: Option<Vec<Granted>>,
    policy: Option<Vec<Granted>>,
) -> S3Result<Option<Acl>> {
    match (canned, headers, policy) {
        (None, None, None) => Ok(None),
        (Some(c), None, None) => Ok(Some(Acl::Canned(c))),
        (None, Some(g), None) | (None, None, Some(g)) => Ok(Some(Acl::Grants(g))),
        _ => Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "give a canned ACL (x-amz-acl), grants (x-amz-grant-*) or an AccessControlPolicy: only one of them",
        )),
    }
}

/// The identities a set of grants names (each must be one the gateway knows).
pub fn named(grants: &[Granted]) -> impl Iterator<Item = &str> {
    grants.iter().filter_map(|g| match &g.to {
        Who::Identity(n) => Some(n.as_str()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canned_acls_say_who_reads_and_writes() {
        assert_eq!(Canned::parse("public-read").unwrap().anonymous(), (true, false));
        assert_eq!(Canned::parse("public-read-write").unwrap().anonymous(), (true, true));
        assert_eq!(Canned::parse("private").unwrap().anonymous(), (false, false));
        assert!(Canned::parse("authenticated-read").unwrap().authenticated_read());
        assert_eq!(Canned::parse("log-delivery-write").unwrap_err().code(), &S3ErrorCode::NotImplemented);
        let owner = Owner { display_name: Some("o".into()), id: Some("o".into()) };
        let g = Acl::Canned(Canned::PublicReadWrite).grants(&owner, "o");
        assert_eq!(g.len(), 3);
        assert_eq!(g[1].grantee.as_ref().and_then(|x| x.uri.as_deref()), Some(ALL_USERS));
        assert_eq!(g[2].grantee.as_ref().and_then(|x| x.id.as_deref()), Some("o"));
        // bucket-owner-read: the writer's, and the bucket owner reads.
        let g = Acl::Canned(Canned::BucketOwnerRead).granted("w", "b");
        assert_eq!(
            g,
            [
                Granted { to: Who::Identity("w".into()), perm: Perm::FullControl },
                Granted { to: Who::Identity("b".into()), perm: Perm::Read }
            ]
        );
        let mut ext = std::collections::BTreeMap::new();
        assert_eq!(Acl::of(&ext), Acl::Canned(Canned::Private));
        ext.insert(ATTR_ACL.to_string(), "public-read".to_string());
        assert_eq!(Acl::of(&ext), Acl::Canned(Canned::PublicRead));
    }

    #[test]
    fn grants_are_kept_parsed_and_honoured() {
        let g = from_headers(
            Some("id=alt"),
            None,
            Some(r#"id="alt", uri="http://acs.amazonaws.com/groups/global/AllUsers""#),
            None,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            g,
            [
                Granted { to: Who::Identity("alt".into()), perm: Perm::Read },
                Granted { to: Who::Identity("alt".into()), perm: Perm::ReadAcp },
                Granted { to: Who::AllUsers, perm: Perm::ReadAcp },
            ]
        );
        assert_eq!(from_headers(None, None, None, None, None).unwrap(), None);
        let acl = Acl::Grants(g);
        assert!(acl.is_public(), "a group is granted something");
        let mut ext = std::collections::BTreeMap::new();
        ext.insert(ATTR_ACL.to_string(), acl.to_attr().unwrap());
        assert_eq!(Acl::of(&ext), acl, "kept and read back");
        let (alt, anon) = (Asker { signed: true, identity: Some("alt") }, Asker { signed: false, identity: None });
        assert!(acl.allows(alt, Perm::Read) && !acl.allows(alt, Perm::Write));
        assert!(acl.allows(anon, Perm::ReadAcp), "AllUsers: anyone");
        assert!(!acl.allows(Asker { signed: true, identity: Some("other") }, Perm::Read));
        let full = Acl::Grants(vec![Granted { to: Who::AuthenticatedUsers, perm: Perm::FullControl }]);
        assert!(full.allows(Asker { signed: true, identity: Some("x") }, Perm::WriteAcp));
        assert!(!full.allows(anon, Perm::Read), "signed only");
        // A canned ACL's owner grants are shown, not honoured; its groups' are.
        let canned = Acl::Canned(Canned::AuthenticatedRead);
        assert!(canned.allows(alt, Perm::Read) && !canned.allows(anon, Perm::Read));
        assert!(!Acl::Canned(Canned::BucketOwnerFullControl).allows(alt, Perm::Read));
        // Bad grants: an e-mail address (no identity has one), an unknown group or type.
        let code = |r: S3Result<Option<Vec<Granted>>>| r.unwrap_err().code().as_str().to_string();
        assert_eq!(
            code(from_headers(Some("emailAddress=a@b.c"), None, None, None, None)),
            "UnresolvableGrantByEmailAddress"
        );
        assert_eq!(code(from_headers(Some("uri=http://example.com/g"), None, None, None, None)), "MalformedACLError");
        assert_eq!(code(from_headers(Some("nobody"), None, None, None, None)), "MalformedACLError");
        // One way of asking at a time.
        assert!(asked(Some(Canned::PublicRead), Some(vec![]), None).is_err());
        assert_eq!(asked(None, None, Some(vec![])).unwrap(), Some(Acl::Grants(vec![])));
    }
}
