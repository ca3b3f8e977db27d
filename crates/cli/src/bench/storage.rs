//! Placeholder until the storage benchmark lands (owned by the storage work).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("the storage benchmark is not built yet")
}
