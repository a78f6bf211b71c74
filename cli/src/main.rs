//! `kubectl-nodewarden`; see the library for the commands.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = nodewarden_cli::Cli::parse();
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = nodewarden_cli::run(&cli, &mut stdout).await {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}
