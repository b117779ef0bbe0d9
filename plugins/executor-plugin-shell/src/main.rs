//! The `executor-plugin-shell` binary: started by the Slipway manager, never by hand.

fn main() -> std::process::ExitCode {
    slipway_executor_plugin::sdk::run_plugin(executor_plugin_shell::ShellProvider::default())
}
