//! The `gstore` command-line tool.

mod args;
mod commands;
mod load;

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    if let Err(e) = commands::run(cli) {
        if e.is::<commands::StdoutClosed>() {
            return;
        }
        eprintln!("gstore: error: {}", message(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, each cause once: most of gstore's errors already
/// say their cause in their own message, and a cause said there is not repeated.
fn message(e: &anyhow::Error) -> String {
    let mut said = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !said.contains(&cause) {
            said = format!("{said}: {cause}");
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer failed: {source}")]
    struct Says {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_is_said_once() {
        let io = || std::io::Error::other("disk on fire");
        assert_eq!(message(&anyhow::Error::new(Says { source: io() })), "outer failed: disk on fire");
        let e = anyhow::Error::new(io()).context("writing x");
        assert_eq!(message(&e), "writing x: disk on fire");
    }
}
