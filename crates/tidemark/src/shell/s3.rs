//! `s3.configure`: the S3 gateway's access keys, SeaweedFS's shell style. Without `-apply` it
//! shows what the document would become; secrets are always shown masked.

use tidemark_engine::docs;
use tidemark_s3::identity::{Action, Edit, IDENTITIES, Identities};

use super::flags::Args;
use super::{CmdError, Context, Out};

fn list_of(v: Option<&str>) -> Vec<String> {
    v.map(|s| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(str::to_string).collect()).unwrap_or_default()
}

pub async fn configure(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let current = docs::read_json::<Identities>(&*ctx.filer, IDENTITIES).await?;
    let (mut ids, version) = match current {
        Some((d, v)) => (d, Some(v)),
        None => (Identities::default(), None),
    };
    let Some(user) = args.get("user") else {
        if args.has_flags() {
            return Err(CmdError::Usage("-user is required to change anything".into()));
        }
        let json = serde_json::to_string_pretty(&ids.masked()).map_err(|e| CmdError::Failed(e.to_string()))?;
        writeln!(out, "{json}")?;
        return Ok(());
    };
    let mut actions = Vec::new();
    for a in list_of(args.get("actions")) {
        actions.push(
            Action::parse(&a)
                .ok_or_else(|| CmdError::Usage(format!("-actions: {a:?} is not one of Read, Write, List, Admin")))?,
        );
    }
    let edit = Edit {
        user: user.to_string(),
        access_key: args.get("access_key").map(str::to_string),
        secret_key: args.get("secret_key").map(str::to_string),
        actions,
        buckets: list_of(args.get("buckets")),
        delete: args.is_set("delete"),
    };
    let what = ids.configure(&edit).map_err(CmdError::Usage)?;
    let json = serde_json::to_string_pretty(&ids.masked()).map_err(|e| CmdError::Failed(e.to_string()))?;
    writeln!(out, "{json}")?;
    if !args.is_set("apply") {
        writeln!(out, "(not saved: add -apply to save this)")?;
        return Ok(());
    }
    match docs::write_json(&*ctx.filer, IDENTITIES, &ids, version).await {
        Ok(_) => {
            writeln!(out, "{what}; the S3 gateways use it within 2 seconds")?;
            Ok(())
        }
        Err(tidemark_core::Error::PreconditionFailed { .. }) => {
            Err(CmdError::Failed(format!("{IDENTITIES} changed meanwhile (another operator?): run the command again")))
        }
        Err(e) => Err(e.into()),
    }
}
