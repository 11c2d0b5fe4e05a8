  /* ---------- head-explorer widgets ---------- */

  /* The build embeds every state (data-qkv-data): each head's weights, their shading and the
   * head's output, and the final output for each combination of heads on and off, keyed by one
   * "1" or "0" per head. The script only picks which to show, so every number is the build's. */
  function setupHeads(root) {
    var data = json(root, "[data-qkv-data]");
    if (!data) return;
    var picks = Array.prototype.slice.call(root.querySelectorAll("[data-qkv-pick]"));
    var switches = Array.prototype.slice.call(root.querySelectorAll("[data-qkv-switch]"));
    var caption = root.querySelector("[data-qkv-caption]");
    var onText = root.querySelector("[data-qkv-on-text]");
    var announce = root.querySelector("[data-qkv-announce]");
    var shown = data.start;

    function cell(name) {
      return root.querySelector('[data-qkv-readout="' + CSS.escape(name) + '"]');
    }
    function vector(row) {
      return row.length === 1 ? row[0] : "(" + row.join(", ") + ")";
    }
    function listed(names) {
      return names.length < 3 ? names.join(" and ") : names.slice(0, -1).join(", ") + " and " + names[names.length - 1];
    }

    function render(say) {
      var flags = switches.map(function (s) {
        return s.checked;
      });
      var key = flags.map(function (b) {
        return b ? "1" : "0";
      }).join("");
      var off = data.labels.filter(function (_, h) {
        return !flags[h];
      });
      data.tokens.forEach(function (q, i) {
        data.keys.forEach(function (k, j) {
          var td = cell("weight:" + q + ":" + k);
          var w = data.shade[shown][i][j];
          td.textContent = data.weights[shown][i][j];
          td.style.setProperty("--w", String(w));
        });
        data.outputs[shown][i].forEach(function (y, c) {
          cell("head-output:" + q + ":" + (c + 1)).textContent = y;
        });
        data.final[key][i].forEach(function (y, c) {
          cell("output:" + q + ":" + (c + 1)).textContent = y;
        });
      });
      root.setAttribute("data-qkv-head", data.heads[shown]);
      root.setAttribute(
        "data-qkv-on",
        data.heads.filter(function (_, h) {
          return flags[h];
        }).join(",")
      );
      caption.textContent =
        data.captions[shown] + (flags[shown] ? ":" : " (switched off, so this output does not reach Wₒ):");
      var state = off.length === 0 ? "every head switched on" : off.length === flags.length ? "every head switched off" : listed(off) + " switched off";
      onText.textContent = "The output, with " + state + ":";
      if (!say) return;
      var own = data.tokens.map(function (q, i) {
        return q + " " + vector(data.outputs[shown][i]);
      });
      var total = data.tokens.map(function (q, i) {
        return q + " " + vector(data.final[key][i]);
      });
      announce.textContent =
        "Showing " + data.labels[shown] + ", whose output is " + own.join(", ") + ". With " + state + ", the output is " + total.join(", ") + ".";
    }

    picks.forEach(function (input, h) {
      input.addEventListener("change", function () {
        if (!input.checked) return;
        shown = h;
        render(true);
      });
    });
    switches.forEach(function (input) {
      input.addEventListener("change", function () {
        render(true);
      });
    });
    root.querySelector("[data-qkv-controls]").hidden = false;
    render(false);
  }

  WIDGETS["head-explorer"] = setupHeads;
