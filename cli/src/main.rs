//! The `gstore` command-line tool.

mod args;
mod commands;
mod containers;
mod failure;
mod hold;
mod load;
mod units;

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    let json = cli.json;
    if let Err(e) = commands::run(cli) {
        // Stdout closed by its reader (`gstore cat ... | head`): not a failure.
        let pipe_closed = |c: &(dyn std::error::Error + 'static)| {
            c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        };
        if e.is::<commands::StdoutClosed>() || e.chain().any(pipe_closed) {
            return;
        }
        let code = failure::classify(&e);
        let message = failure::message(&e, code);
        eprintln!("gstore: error: {message}");
        if json && !commands::emitted() {
            let report =
                failure::ErrorReport { error: failure::ErrorBody { code, exit_status: code.exit_status(), message } };
            println!("{}", serde_json::to_string_pretty(&report).expect("an error report serializes"));
        }
        std::process::exit(code.exit_status());
    }
}
