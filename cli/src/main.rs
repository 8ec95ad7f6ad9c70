//! The `gstore` command-line tool.

mod about;
mod args;
mod commands;
mod containers;
mod failure;
mod files;
mod hold;
mod images;
mod init;
mod load;
mod maintain;
mod output;
mod policy;
mod process;
mod serve;
mod stores;
mod units;

use clap::Parser;

fn main() {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => refuse_arguments(e),
    };
    let json = cli.json;
    if let Err(e) = commands::run(cli) {
        // Stdout closed by its reader (`gstore cat ... | head`): not a failure.
        let pipe_closed = |c: &(dyn std::error::Error + 'static)| {
            c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        };
        if e.is::<output::StdoutClosed>() || e.chain().any(pipe_closed) {
            return;
        }
        let code = failure::classify(&e);
        let message = failure::message(&e, code);
        eprintln!("gstore: error: {message}");
        if json && !output::emitted() {
            let report =
                failure::ErrorReport { error: failure::ErrorBody { code, exit_status: code.exit_status(), message } };
            println!("{}", serde_json::to_string_pretty(&report).expect("an error report serializes"));
        }
        std::process::exit(code.exit_status());
    }
}

/// Ends on a command line the parser refused: its message on stderr (help and `--version`
/// on stdout, exit 0, as clap does), and under `--json` one error report on stdout too, as
/// for any other failure (docs/CLI.md).
fn refuse_arguments(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    let informational = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
    if informational || !std::env::args().skip(1).any(|a| a == "--json") {
        e.exit();
    }
    let code = failure::Code::Usage;
    let rendered = e.render().to_string();
    eprint!("{rendered}");
    let first = rendered.lines().next().unwrap_or_default();
    let message = first.trim_start_matches("error: ").to_string();
    let report = failure::ErrorReport { error: failure::ErrorBody { code, exit_status: code.exit_status(), message } };
    println!("{}", serde_json::to_string_pretty(&report).expect("an error report serializes"));
    std::process::exit(code.exit_status());
}
