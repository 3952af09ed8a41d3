/* The analytics page's charts, drawn from the report embedded with json_script.
 * Chart.js is served from this app's static files (vendor/chart.umd.min.js), never a CDN.
 * The Chart instances are kept on window.streamrecoverCharts (the browser test reads them). */
(function () {
  "use strict";

  var COLORS = ["#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#57606a", "#0550ae"];

  function toggleCustom() {
    var select = document.querySelector("#sr-filters select[name=window]");
    var custom = document.getElementById("sr-custom");
    if (!select || !custom) return;
    var sync = function () { custom.hidden = select.value !== "custom"; };
    select.addEventListener("change", sync);
    sync();
  }

  function label(bucket, unit) {
    // "2026-11-28T14:00:00+00:00" -> "11-28 14:00" (hours) or "2026-11-28" (days), as recorded.
    return unit === "hour" ? bucket.slice(5, 10) + " " + bucket.slice(11, 16) : bucket.slice(0, 10);
  }

  function percent(value) {
    return value === null || value === undefined ? null : Math.round(value * 1000) / 10;
  }

  function lineChart(canvas, labels, datasets, options) {
    return new window.Chart(canvas, {
      type: "line",
      data: { labels: labels, datasets: datasets },
      options: Object.assign({
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        spanGaps: true,
        interaction: { mode: "index", intersect: false },
        scales: { y: { beginAtZero: true } }
      }, options || {})
    });
  }

  function barChart(canvas, breakdown) {
    var keys = Object.keys(breakdown);
    return new window.Chart(canvas, {
      type: "bar",
      data: {
        labels: keys,
        datasets: [{
          label: "interruptions",
          data: keys.map(function (k) { return breakdown[k]; }),
          backgroundColor: keys.map(function (_, i) { return COLORS[i % COLORS.length]; })
        }]
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        plugins: { legend: { display: false } },
        scales: { y: { beginAtZero: true, ticks: { precision: 0 } } }
      }
    });
  }

  function series(points, key) {
    return points.map(function (p) { return p[key]; });
  }

  function draw() {
    var source = document.getElementById("sr-analytics-report");
    if (!source || !window.Chart) return null;
    var report = JSON.parse(source.textContent);
    var unit = report.window.bucket;
    var points = report.series;
    var labels = points.map(function (p) { return label(p.bucket, unit); });
    var line = function (name, key, color, values) {
      return {
        label: name,
        data: values || series(points, key),
        borderColor: color,
        backgroundColor: color,
        pointRadius: points.length > 60 ? 0 : 2,
        borderWidth: 2,
        tension: 0.2
      };
    };
    return {
      series: lineChart(document.getElementById("sr-chart-series"), labels, [
        line("runs", "runs", COLORS[0]),
        line("interrupted runs", "interrupted_runs", COLORS[1]),
        line("recovered runs", "recovered_runs", COLORS[2])
      ], { scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } }),
      rates: lineChart(document.getElementById("sr-chart-rates"), labels, [
        line("interruption rate %", null, COLORS[1], points.map(function (p) { return percent(p.interruption_rate); })),
        line("recovery rate %", null, COLORS[2], points.map(function (p) { return percent(p.recovery_rate); }))
      ], { scales: { y: { beginAtZero: true, suggestedMax: 100 } } }),
      causes: barChart(document.getElementById("sr-chart-causes"), report.totals.interruptions_by_cause),
      plans: barChart(document.getElementById("sr-chart-plans"), report.totals.interruptions_by_plan)
    };
  }

  function start() {
    toggleCustom();
    window.streamrecoverCharts = draw();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
