//! `gstore policy`: the retention policies stored in the store (docs/GC.md).

use crate::args::PolicyAction;
use crate::output::Output;
use anyhow::Result;
use gstore_store::commands::gc::policies::{self, Policies};
use gstore_store::commands::gc::retention::Policy;
use gstore_store::{Store, StoreLocation};

/// Runs one `gstore policy` subcommand.
pub fn run(location: &StoreLocation, action: PolicyAction, out: &Output) -> Result<()> {
    let store = Store::open(location)?;
    let all = match action {
        PolicyAction::Set { pattern, rules } => policies::set(&store, &pattern, rules.policy(None))?,
        PolicyAction::Show => policies::read(&store)?,
        PolicyAction::Rm { pattern } => policies::remove(&store, &pattern)?,
    };
    out.emit(&all, || text(&all))
}

/// One line a policy: its pattern and its rules.
fn text(all: &Policies) -> String {
    if all.policies.is_empty() {
        return "no stored policy: gc applies only its own flags".into();
    }
    let width = all.policies.keys().map(|p| p.len()).max().unwrap_or(0).max("PATTERN".len());
    let mut s = format!("{:<width$}  RULES", "PATTERN");
    for (pattern, p) in &all.policies {
        s += &format!("\n{pattern:<width$}  {}", rules(p));
    }
    s
}

/// The rules as `gstore gc` flags.
fn rules(p: &Policy) -> String {
    let mut r = Vec::new();
    if let Some(n) = p.keep_last {
        r.push(format!("--keep-last {n}"));
    }
    if let Some(secs) = p.keep_within_secs {
        r.push(format!("--keep-within {}", humantime::format_duration(std::time::Duration::from_secs(secs))));
    }
    if let Some(n) = p.keep_daily {
        r.push(format!("--keep-daily {n}"));
    }
    if let Some(n) = p.keep_weekly {
        r.push(format!("--keep-weekly {n}"));
    }
    r.join(" ")
}
