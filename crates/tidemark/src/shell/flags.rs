//! Go-style flags, as in the reference's shell: `-dir=/x`, `-dir /x`, `--dir=/x`, `--dir /x`;
//! boolean flags alone (`-l`) or with a value (`-delete=false`); `--` ends the flags. Flags and
//! positional arguments may be interleaved.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    Bool,
    Value,
}

#[derive(Debug, Clone)]
pub struct FlagSpec {
    pub name: &'static str,
    pub kind: FlagKind,
    pub help: &'static str,
}

pub const fn flag(name: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec { name, kind: FlagKind::Value, help }
}

pub const fn switch(name: &'static str, help: &'static str) -> FlagSpec {
    FlagSpec { name, kind: FlagKind::Bool, help }
}

/// The parsed arguments of one command.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    values: BTreeMap<String, String>,
    pub positional: Vec<String>,
}

impl Args {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }
    pub fn is_set(&self, name: &str) -> bool {
        self.values.get(name).is_some_and(|v| v == "true")
    }
    /// A boolean flag's value, or `default` when it was not given.
    pub fn bool_or(&self, name: &str, default: bool) -> bool {
        self.values.get(name).map_or(default, |v| v == "true")
    }
    /// Every flag given whose name starts with `prefix` (`s3.`), as (rest of the name, value).
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.values.iter().filter_map(move |(k, v)| k.strip_prefix(prefix).map(|rest| (rest, v.as_str())))
    }
    /// Whether any flag at all was given.
    pub fn has_flags(&self) -> bool {
        !self.values.is_empty()
    }
}

fn parse_bool(name: &str, v: &str) -> Result<String, String> {
    match v {
        "true" | "1" | "t" | "T" | "TRUE" | "True" => Ok("true".into()),
        "false" | "0" | "f" | "F" | "FALSE" | "False" => Ok("false".into()),
        _ => Err(format!("flag -{name} takes true or false, not {v:?}")),
    }
}

pub fn parse(specs: &[FlagSpec], words: &[String]) -> Result<Args, String> {
    let mut args = Args::default();
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        i += 1;
        if w == "--" {
            args.positional.extend(words[i..].iter().cloned());
            break;
        }
        let Some(stripped) = w.strip_prefix("--").or_else(|| w.strip_prefix('-')).filter(|s| !s.is_empty()) else {
            // `-` alone (stdin) and anything without a leading dash is positional.
            args.positional.push(w.clone());
            continue;
        };
        let (name, inline) = match stripped.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (stripped, None),
        };
        let spec = specs.iter().find(|s| s.name == name).ok_or_else(|| format!("unknown flag -{name}"))?;
        let value = match (spec.kind, inline) {
            (FlagKind::Bool, None) => "true".to_string(),
            (FlagKind::Bool, Some(v)) => parse_bool(name, &v)?,
            (FlagKind::Value, Some(v)) => v,
            (FlagKind::Value, None) => {
                let v = words.get(i).ok_or_else(|| format!("flag -{name} needs a value"))?;
                i += 1;
                v.clone()
            }
        };
        if args.values.insert(name.to_string(), value).is_some() {
            return Err(format!("flag -{name} given twice"));
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[FlagSpec] = &[flag("dir", "d"), switch("l", "long"), switch("delete", "del")];

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn all_go_spellings_work() {
        for line in ["-dir=/x", "-dir /x", "--dir=/x", "--dir /x"] {
            let a = parse(SPECS, &words(line)).unwrap();
            assert_eq!(a.get("dir"), Some("/x"), "{line}");
        }
        let a = parse(SPECS, &words("/p -l -delete=false")).unwrap();
        assert!(a.is_set("l"));
        assert!(!a.is_set("delete"));
        assert_eq!(a.positional, ["/p"]);
        let a = parse(SPECS, &words("-l -- -dir")).unwrap();
        assert_eq!(a.positional, ["-dir"]);
        assert_eq!(parse(SPECS, &words("- x")).unwrap().positional, ["-", "x"]);
    }

    #[test]
    fn mistakes_are_named() {
        assert_eq!(parse(SPECS, &words("-nope")).unwrap_err(), "unknown flag -nope");
        assert_eq!(parse(SPECS, &words("-dir")).unwrap_err(), "flag -dir needs a value");
        assert!(parse(SPECS, &words("-l=maybe")).unwrap_err().contains("true or false"));
        assert!(parse(SPECS, &words("-dir=a -dir=b")).unwrap_err().contains("twice"));
    }
}
