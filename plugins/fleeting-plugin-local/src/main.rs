//! The `fleeting-plugin-local` binary: serves [`fleeting_plugin_local::LocalGroup`] over gRPC.

fn main() -> std::process::ExitCode {
    slipway_fleeting::sdk::run_plugin(fleeting_plugin_local::LocalGroup::default())
}
