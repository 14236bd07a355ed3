//! What the overview page (`/`) reads of the store for one filter and page, kept in
//! `AppState::overview` until the store changes.

use kernel_registry::Arch;
use kernel_store::{GlanceCell, KernelQuery, MatrixFilter, MatrixRow, Store, UnverifiedKernel};

/// What the overview shows of the store for one filter and page.
pub struct OverviewData {
    pub(super) rows: Vec<MatrixRow>,
    pub(super) total_rows: i64,
    pub(super) glance: Vec<GlanceCell>,
    pub(super) archs: Vec<Arch>,
    pub(super) unverified: Vec<UnverifiedKernel>,
    pub(super) total_unverified: i64,
    /// Kernels matching the filter (read only when no row does: the empty state says it).
    pub(super) total_kernels: i64,
}

impl OverviewData {
    /// A bounded number of indexed queries, whatever the number of kernels: a page of the
    /// matrix, the glance aggregates, the architectures, a page of the awaiting kernels.
    pub(super) async fn read(
        store: &Store,
        f: MatrixFilter,
        limit: i64,
        offset: i64,
        uoffset: i64,
    ) -> Result<OverviewData, kernel_store::StoreError> {
        let (rows, total_rows) = store.matrix_page(f, limit, offset).await?;
        let glance = if total_rows > 0 {
            store.glance(f).await?
        } else {
            vec![]
        };
        let archs = store.archs_verified(f).await?;
        let (unverified, total_unverified) = store.unverified_page(f, limit, uoffset).await?;
        let total_kernels = if total_rows == 0 {
            store
                .list_kernels(&KernelQuery {
                    op: f.op,
                    dtype: f.dtype,
                    limit: 1,
                    ..Default::default()
                })
                .await?
                .1
        } else {
            0
        };
        Ok(OverviewData {
            rows,
            total_rows,
            glance,
            archs,
            unverified,
            total_unverified,
            total_kernels,
        })
    }
}
