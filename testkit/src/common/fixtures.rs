//! Fixture trees copied into a test's temp dir, and the edits tests make to a copy.

use std::path::{Path, PathBuf};

/// Copies a fixture tree (a sysfs snapshot) to `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// The InfiniBand devices of the `mlx5-8x` fixture (an 8x ConnectX GPU host; its RoCE bond
/// aside).
pub const MLX5_8X_IB: [&str; 8] = [
    "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
];

/// A copy of the `mlx5-8x` fixture at `root` with every port ACTIVE (the fixture's mlx5_3 is
/// DOWN).
pub fn mlx5_8x_active(root: &Path) {
    copy_tree(Path::new("tests/fixtures/sysfs/mlx5-8x"), root);
    std::fs::write(port_file(root, "mlx5_3", "state"), "4: ACTIVE\n").unwrap();
}

/// The config of a daemon observing the `mlx5-8x` copy at `root` through sysfs, its eight
/// InfiniBand devices as its ports; `observer` is added to the `[observer]` table.
pub fn mlx5_8x_config(root: &Path, observer: &str) -> String {
    let devices: Vec<String> = MLX5_8X_IB.iter().map(|d| format!("\"{d}\"")).collect();
    format!(
        "[observer]\nkind = \"sysfs\"\nsysfs_root = \"{}\"\n{observer}[ports]\ndevices = [{}]\n",
        root.display(),
        devices.join(", ")
    )
}

/// A file of port 1 of `dev` in the sysfs tree at `root`.
pub fn port_file(root: &Path, dev: &str, file: &str) -> PathBuf {
    root.join(dev).join("ports/1").join(file)
}

/// Writes slot `index` of the P_Key table of `dev`'s port 1.
pub fn set_pkey(root: &Path, dev: &str, index: usize, value: u16) {
    std::fs::write(
        port_file(root, dev, &format!("pkeys/{index}")),
        format!("{value:#06x}\n"),
    )
    .unwrap();
}
