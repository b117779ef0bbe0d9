// Refreshes the page from /api/v1/status: the same markup page.rs renders on the server.
(function () {
  "use strict";
  var body = document.body;
  var every = Number(body.dataset.refreshMs) || 2000;
  var api = "api/v1/status" + location.search;
  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function dur(x) {
    var s = x > 0 && isFinite(x) ? Math.floor(x) : 0;
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + pad(Math.floor((s % 3600) / 60)) + "m";
    return Math.floor(s / 86400) + "d" + pad(Math.floor((s % 86400) / 3600)) + "h";
  }
  function size(n) {
    if (n < 1024) return n + " B";
    var units = ["KiB", "MiB", "GiB", "TiB"], v = n / 1024, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (v < 10 ? v.toFixed(1) : v.toFixed(0)) + " " + units[i];
  }
  // As format.rs's money: four decimals below 1, two above.
  function money(v, cur) { return (Math.abs(v) < 1 ? v.toFixed(4) : v.toFixed(2)) + " " + cur; }
  function num(v) { return Math.abs(v - Math.round(v)) < 0.05 ? String(Math.round(v)) : v.toFixed(1); }
  function totals(s) {
    var t = { instances: 0, ready: 0, busy_slots: 0, idle_slots: 0, pending: 0 };
    s.runners.forEach(function (r) { for (var k in t) t[k] += r.totals[k]; });
    return t;
  }
  function summary(s) {
    var t = totals(s);
    return t.instances + " instances · " + t.ready + " ready · " + t.busy_slots + "/" +
      (t.busy_slots + t.idle_slots) + " slots busy · " + t.pending + " pending" +
      (s.queue ? " · " + s.queue.pending + " queued" : "");
  }
  function chart(key, title, values, unit, span) {
    var W = 300, H = 60, max = 1;
    for (var k = 0; k < values.length; k++) if (values[k] > max) max = values[k];
    var last = values.length ? values[values.length - 1] : 0;
    var step = values.length > 1 ? W / (values.length - 1) : 0;
    var pts = values.map(function (v, i) {
      return (i * step).toFixed(1) + "," + (H - (v / max) * (H - 4) - 2).toFixed(1);
    }).join(" ");
    return '<figure class="chart" data-series="' + key + '"><figcaption>' + title + " <b>" +
      num(last) + unit + "</b> <small>max " + num(max) + unit + " · last " + span + '</small></figcaption><svg viewBox="0 0 ' +
      W + " " + H + '" preserveAspectRatio="none"><polyline points="' + pts + '"/></svg></figure>';
  }
  function instance(i, maxUse) {
    var uses = maxUse ? i.uses + "/" + maxUse : String(i.uses);
    var h = '<tr class="instance" data-instance="' + esc(i.id) + '" data-state="' + esc(i.state) +
      '"><td class="id">' + esc(i.id) + '</td><td class="state ' + esc(i.state) + '">' + esc(i.state) +
      "</td><td>" + dur(i.age_s) + "</td><td>" + uses + '</td><td><div class="slots">';
    i.slots.forEach(function (s) {
      var j = s.job;
      if (j) {
        h += '<span class="slot busy" data-slot="' + s.slot + '" data-job="' + j.id + '" title="slot ' +
          s.slot + " · " + esc(j.stage) + " · " + esc(j.level) + '"><b>#' + j.id + " " + esc(j.name) +
          "</b><i>" + esc(j.level) + " · " + dur(j.elapsed_s) + "</i></span>";
      } else {
        h += '<span class="slot free" data-slot="' + s.slot + '" title="slot ' + s.slot + '"><i>free</i></span>';
      }
    });
    h += "</div></td><td>";
    i.snapshots.forEach(function (sn) {
      h += '<span class="snapshot" data-snapshot="' + esc(sn.name) + '">' + esc(sn.name) + " <i>" +
        size(sn.bytes) + " · " + dur(sn.age_s) + "</i></span>";
    });
    return h + "</td></tr>";
  }
  function shape(s) {
    var h = '<div class="shape" data-shape="' + esc(s.name) + '"><h3>Shape ' + esc(s.name) +
      " <small>" + (s.role ? '<b class="role">' + esc(s.role) + "</b> · " : "") + "group " +
      esc(s.group) + " · " + s.capacity_per_instance + " slots per instance · max " +
      (s.max_instances ? s.max_instances : "∞") + " instances</small></h3>";
    var n = s.no_capacity;
    if (n) h += '<p class="no-capacity">No capacity for new instances for ' + dur(n.since_s) + " (" +
      n.refusals + " refusals)" + (n.diverted_to ? ": new capacity goes to " + esc(n.diverted_to) : "") +
      ".</p>";
    if (!s.instances.length) return h + '<p class="empty">No instances.</p></div>';
    h += '<table class="instances"><thead><tr><th>instance</th><th>state</th><th>age</th>' +
      "<th>uses</th><th>slots</th><th>snapshots</th></tr></thead><tbody>";
    s.instances.forEach(function (i) { h += instance(i, s.max_use_count); });
    return h + "</tbody></table></div>";
  }
  // A runner's waiting jobs ("pending", with their level) or the queue's ("queued").
  function waitingTable(cls, jobs, withLevel) {
    var h = '<table class="' + cls + '"><thead><tr><th>job</th><th>name</th><th>stage</th>' +
      (withLevel ? "<th>level</th><th>waiting</th>" : "<th>queued for</th>") + "</tr></thead><tbody>";
    jobs.forEach(function (p) {
      h += '<tr data-job="' + p.id + '"><td>#' + p.id + "</td><td>" + esc(p.name) + "</td><td>" +
        esc(p.stage) + "</td>" + (withLevel ? "<td>" + esc(p.level) + "</td>" : "") + "<td>" +
        dur(p.wait_s) + "</td></tr>";
    });
    return h + "</tbody></table>";
  }
  function queue(q) {
    var h = '<section class="queue" data-queued="' + q.pending + '"><h2>Queue <small>' + q.pending +
      " jobs waiting for a runner</small></h2>";
    if (q.jobs.length) h += waitingTable("queued", q.jobs, false);
    return h + "</section>";
  }
  function runner(r) {
    var t = r.totals;
    var h = '<section class="runner" data-runner="' + esc(r.name) + '"><h2>' + esc(r.name) +
      " <small>" + esc(r.executor) + '</small></h2><p class="totals">' + t.instances + " instances · " +
      t.ready + " ready · " + t.busy_slots + "/" + (t.busy_slots + t.idle_slots) + " slots busy · " +
      t.running + " running · " + t.pending + " pending</p>";
    var c = r.costs;
    if (c) {
      h += '<p class="costs">Cost: <b>' + esc(money(c.per_hour, c.currency)) + "</b> per hour now · " +
        esc(money(c.billed, c.currency)) + " billed · " + esc(money(c.jobs, c.currency)) + " to jobs · " +
        esc(money(c.overhead, c.currency)) + " overhead (" +
        Math.round(c.billed > 0 ? c.overhead / c.billed * 100 : 0) + "%)</p>";
      if (c.unpriced && c.unpriced.length)
        h += '<p class="unpriced">Cost unknown for shapes without a price: ' + esc(c.unpriced.join(", ")) + ".</p>";
    }
    var starts = r.vm_starts || [];
    if (starts.length) {
      h += '<p class="vm-starts">VM starts:';
      starts.forEach(function (v, i) {
        var all = v.warm + v.cold;
        h += (i ? " ·" : "") + ' <span class="image">' + esc(v.image) + "</span> " + v.warm +
          " warm / " + v.cold + " cold (" + (all ? Math.floor(v.warm * 100 / all) : 0) + "% warm)";
      });
      h += "</p>";
    }
    r.shapes.forEach(function (s) { h += shape(s); });
    h += "<h3>Pending jobs</h3>";
    if (!r.pending.length) h += '<p class="empty">None waiting.</p>';
    else h += waitingTable("pending", r.pending, true);
    h += "<h3>Recent jobs</h3>";
    if (!r.recent.length) h += '<p class="empty">None yet.</p>';
    else {
      h += '<table class="recent"><thead><tr><th>job</th><th>name</th><th>stage</th>' +
        "<th>outcome</th><th>reason</th><th>where</th><th>waited</th><th>ran</th>" +
        (c ? "<th>cost</th>" : "") + "</tr></thead><tbody>";
      r.recent.forEach(function (j) {
        var reason = j.failure_reason && j.message ? j.failure_reason + ": " + j.message
          : j.failure_reason || j.message || "";
        var place = j.instance != null && j.slot != null ? j.instance + " slot " + j.slot : "never ran";
        var o = esc(j.outcome);
        h += '<tr data-job="' + j.id + '" data-outcome="' + o + '"><td>#' + j.id + "</td><td>" +
          esc(j.name) + "</td><td>" + esc(j.stage) + '</td><td class="outcome ' + o + '">' + o +
          "</td><td>" + esc(reason) + "</td><td>" + esc(place) + "</td><td>" + dur(j.wait_s) +
          "</td><td>" + dur(j.duration_s) + "</td>" +
          (c ? '<td class="cost">' + esc(j.cost != null && j.currency != null ? money(j.cost, j.currency) : "unknown") + "</td>" : "") +
          "</tr>";
      });
      h += "</tbody></table>";
    }
    return h + "</section>";
  }
  function render(s) {
    document.getElementById("summary").textContent = summary(s);
    document.getElementById("updated").textContent = "version " + s.version + " · up " + dur(s.uptime_s);
    var hs = s.history, span = dur(hs.t_ms.length * hs.interval_s);
    document.getElementById("charts").innerHTML =
      chart("instances", "Instances", hs.instances, "", span) +
      chart("busy_slots", "Busy slots", hs.busy_slots, "", span) +
      chart("queue_depth", "Queue depth", hs.queue_depth, "", span) +
      chart("p95_wait_s", "p95 wait", hs.p95_wait_s, "s", span);
    var h = s.queue ? queue(s.queue) : "";
    if (!s.runners.length) h += '<p class="empty">No runners.</p>';
    s.runners.forEach(function (r) { h += runner(r); });
    document.getElementById("fleet").innerHTML = h;
    body.dataset.generated = s.generated_at_ms;
    body.dataset.refreshes = Number(body.dataset.refreshes) + 1;
    body.classList.remove("stale");
  }
  // A big fleet's answer is large to re-render: refresh it less often (1 s per 200 kB of JSON,
  // at most 30 s).
  var next = every;
  function refresh() {
    fetch(api, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (text) {
        next = Math.max(every, Math.min(30000, text.length / 200));
        render(JSON.parse(text));
      })
      .catch(function (e) {
        body.classList.add("stale");
        document.getElementById("updated").textContent = "not refreshed: " + e.message;
      })
      .then(function () { setTimeout(refresh, next); });
  }
  setTimeout(refresh, every);
})();
