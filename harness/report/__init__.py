"""Reports: the judge (saved run data → report dict), the plain-JSON report, and the
terminal summary. Journal, Allure and plots build on the same report dict."""

from harness.report.json_report import build_report, read_report, write_report

__all__ = ["build_report", "write_report", "read_report"]
