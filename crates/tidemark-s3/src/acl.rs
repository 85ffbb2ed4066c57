//! Canned ACLs, honoured: `public-read` lets unsigned requests read (an object's bytes, a
//! bucket's listing), `public-read-write` on a bucket lets them write its objects too, and
//! `authenticated-read` lets every configured identity read. Kept as `s3.acl` in the bucket's or
//! the object's entry. Grants to particular accounts (`x-amz-grant-*`, an `AccessControlPolicy`
//! document) are refused: who may do what to which bucket is the identities' (`s3.configure`),
//! and nothing is stored as if a grant were kept. Pure: no I/O.

use s3s::dto::{Grant, Grantee, Owner, Permission, Type};
use s3s::{S3Error, S3ErrorCode, S3Result};

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

    /// The grants S3 shows for it, the owner's first.
    pub fn grants(self, owner: &Owner) -> Vec<Grant> {
        let owner_grant = |p: &str| Grant {
            grantee: Some(Grantee {
                display_name: owner.display_name.clone(),
                email_address: None,
                id: owner.id.clone(),
                type_: Type::from(Type::CANONICAL_USER.to_string()),
                uri: None,
            }),
            permission: Some(Permission::from(p.to_string())),
        };
        let group = |uri: &str, p: &str| Grant {
            grantee: Some(Grantee {
                display_name: None,
                email_address: None,
                id: None,
                type_: Type::from(Type::GROUP.to_string()),
                uri: Some(uri.to_string()),
            }),
            permission: Some(Permission::from(p.to_string())),
        };
        // The groups' grants first, then the owner's (the order ceph/s3-tests expects).
        let mut g = match self {
            Canned::PublicRead => vec![group(ALL_USERS, Permission::READ)],
            Canned::PublicReadWrite => vec![group(ALL_USERS, Permission::READ), group(ALL_USERS, Permission::WRITE)],
            Canned::AuthenticatedRead => vec![group(AUTHENTICATED_USERS, Permission::READ)],
            _ => vec![],
        };
        g.push(owner_grant(Permission::FULL_CONTROL));
        g
    }
}

/// The canned ACL kept in an entry's attributes (none: private).
pub fn of(ext: &std::collections::BTreeMap<String, String>) -> Canned {
    ext.get(ATTR_ACL).and_then(|s| Canned::parse(s).ok()).unwrap_or(Canned::Private)
}

/// Refuses grants to particular accounts (headers or a policy document): not kept here.
pub fn refuse_grants(any_grant: bool) -> S3Result<()> {
    if any_grant {
        return Err(S3Error::with_message(
            S3ErrorCode::NotImplemented,
            "grants to particular accounts (x-amz-grant-*, an AccessControlPolicy) are not kept: give identities their actions and buckets with s3.configure, or use a canned ACL (x-amz-acl); nothing was stored",
        ));
    }
    Ok(())
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
        let g = Canned::PublicReadWrite.grants(&owner);
        assert_eq!(g.len(), 3);
        assert_eq!(g[1].grantee.as_ref().and_then(|x| x.uri.as_deref()), Some(ALL_USERS));
        assert_eq!(g[2].grantee.as_ref().and_then(|x| x.id.as_deref()), Some("o"));
        let mut ext = std::collections::BTreeMap::new();
        assert_eq!(of(&ext), Canned::Private);
        ext.insert(ATTR_ACL.to_string(), "public-read".to_string());
        assert_eq!(of(&ext), Canned::PublicRead);
        assert!(refuse_grants(true).is_err() && refuse_grants(false).is_ok());
    }
}
