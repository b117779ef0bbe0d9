//! The `fleeting-plugin-static` binary: serves [`fleeting_plugin_static::StaticGroup`] over gRPC.

fn main() -> std::process::ExitCode {
    slipway_fleeting::sdk::run_plugin(fleeting_plugin_static::StaticGroup::default())
}
