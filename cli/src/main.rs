//! The `gstore` command-line tool.

mod args;
mod commands;
mod load;
mod progress;

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    if let Err(e) = commands::run(cli) {
        if e.is::<commands::StdoutClosed>() {
            return;
        }
        eprintln!("gstore: error: {e:#}");
        std::process::exit(1);
    }
}
