//! The `fleeting-plugin-aws` binary.

fn main() -> std::process::ExitCode {
    slipway_fleeting::sdk::run_plugin(fleeting_plugin_aws::AwsGroup::default())
}
