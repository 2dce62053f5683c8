//! Flow records out as OTLP logs (`weftd --flows-otlp`): each ended flow, or each
//! closed 15 s aggregate, filtered as the operator asks, handed to the OpenTelemetry
//! SDK's batch processor, which sends them to the endpoint the standard `OTEL_*`
//! variables name (the one traces go to). The attributes are `weft_flows::otlp`'s.
//!
//! Emitting only queues: the batch processor exports on its own thread from a bounded
//! queue (`OTEL_BLRP_MAX_QUEUE_SIZE`, 2,048 by default), so a slow or absent collector
//! costs records, never the flow reader's pace.

use opentelemetry::logs::{Logger, LoggerProvider};
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};
use weft_flows::{Aggregates, EndReason, Filter, FlowRecord};

/// What goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpRecords {
    /// One record per ended flow (and per refused attempt).
    Flows,
    /// One record per key of each closed 15 s bucket.
    Aggregates,
}

/// The OTLP export asked for.
#[derive(Debug, Clone)]
pub struct OtlpExportConfig {
    /// Flows or aggregates.
    pub records: OtlpRecords,
    /// Which ones (empty: all).
    pub filter: Filter,
}

/// The export, running.
pub struct OtlpExport {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
    cfg: OtlpExportConfig,
    /// The end of the newest bucket exported (aggregates only; at the start, none).
    exported_until_ms: i64,
    /// Records handed to the exporter since the start.
    pub records: u64,
}

impl OtlpExport {
    /// Starts the export for node `node`; an error when no OTLP endpoint is
    /// configured (asking for an export that goes nowhere is a mistake worth saying).
    /// Must be called inside a tokio runtime.
    pub fn start(node: &str, cfg: OtlpExportConfig) -> Result<Self, String> {
        let provider = weft_telemetry::otel::logger_provider(node, env!("CARGO_PKG_VERSION"))?.ok_or_else(|| {
            "flows are to be exported over OTLP but no endpoint is configured: set OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_LOGS_ENDPOINT)".to_string()
        })?;
        let logger = provider.logger("weft.flows");
        Ok(OtlpExport {
            provider,
            logger,
            cfg,
            exported_until_ms: i64::MIN,
            records: 0,
        })
    }

    /// Exports `r` if flows are exported, it has ended and the filter wants it.
    pub fn flow(&mut self, r: &FlowRecord, now_ms: i64) {
        if self.cfg.records != OtlpRecords::Flows || r.end == EndReason::Open || !self.cfg.filter.matches(r) {
            return;
        }
        let mut rec = self.logger.create_log_record();
        weft_flows::otlp::flow(&mut rec, r, now_ms);
        self.logger.emit(rec);
        self.records += 1;
    }

    /// Exports the buckets that closed since the last call, if aggregates are exported
    /// (see [`Aggregates::closed`]).
    pub fn aggregates(&mut self, aggs: &Aggregates, now_ms: i64) {
        if self.cfg.records != OtlpRecords::Aggregates {
            return;
        }
        let (closed, until) = aggs.closed(self.exported_until_ms, now_ms);
        for a in closed.iter().filter(|a| super::aggregate_matches(&self.cfg.filter, a)) {
            let mut rec = self.logger.create_log_record();
            weft_flows::otlp::aggregate(&mut rec, a, now_ms);
            self.logger.emit(rec);
            self.records += 1;
        }
        self.exported_until_ms = until;
    }

    /// Sends what is queued and stops (on the caller's thread: it blocks).
    pub fn shutdown(&self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }
}
