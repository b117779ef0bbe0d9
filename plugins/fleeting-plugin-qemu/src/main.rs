//! The `fleeting-plugin-qemu` binary.

use fleeting_plugin_qemu::QemuGroup;

fn main() -> std::process::ExitCode {
    slipway_fleeting::sdk::run_plugin(QemuGroup::default())
}
