  /* ---------- attention-matrix widgets ---------- */

  function setupMatrix(root) {
    var rows = root.querySelectorAll("tr[data-qkv-row]");
    var panels = {};
    root.querySelectorAll("[data-qkv-steps]").forEach(function (panel, i) {
      panels[panel.getAttribute("data-qkv-steps")] = panel;
      panel.id = panel.id || root.id + "-steps-" + i;
      panel.hidden = true;
    });
    function pick(row) {
      var label = row.getAttribute("data-qkv-row");
      var open = row.getAttribute("aria-expanded") !== "true";
      rows.forEach(function (r) {
        var mine = r === row && open;
        r.setAttribute("aria-expanded", mine ? "true" : "false");
        r.classList.toggle("picked", mine);
        var panel = panels[r.getAttribute("data-qkv-row")];
        if (panel) {
          panel.hidden = !mine;
          panel.open = mine;
        }
      });
      if (open && panels[label]) panels[label].scrollIntoView({ block: "nearest" });
    }
    rows.forEach(function (row) {
      var panel = panels[row.getAttribute("data-qkv-row")];
      row.tabIndex = 0;
      row.setAttribute("role", "button");
      row.setAttribute("aria-expanded", "false");
      if (panel) row.setAttribute("aria-controls", panel.id);
      row.addEventListener("click", function () {
        pick(row);
      });
      row.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          pick(row);
        }
      });
    });
  }

  WIDGETS["attention-matrix"] = setupMatrix;
