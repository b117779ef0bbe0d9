//! The `executor-plugin-nesting` binary: started by the Slipway manager, never by hand.

fn main() -> std::process::ExitCode {
    slipway_executor_plugin::sdk::run_plugin(executor_plugin_nesting::NestingProvider::default())
}
