  /* ---------- position-sweep widgets ---------- */

  /* A query moved along the positions, its key a fixed distance behind. The build embedded every
   * point's readouts as the page shows them (states[point][readout]), so a choice only writes
   * that text: the script never rotates anything. */
  function setupSweep(root) {
    var data = json(root, "[data-qkv-data]");
    var controls = root.querySelector(".controls");
    if (!data || !controls) return;
    var announce = root.querySelector("[data-qkv-announce]");
    function render(i, speak) {
      var s = data.states[i];
      data.names.forEach(function (name, k) {
        root.querySelector('[data-qkv-readout="' + name + '"]').textContent = s[k];
      });
      root.setAttribute("data-qkv-position", s[0]);
      if (speak) {
        announce.textContent = "Query at " + s[0] + ", key at " + s[1] + ": score with RoPE " + s[4] +
          ", with sinusoids added " + s[5] + ".";
      }
    }
    root.querySelectorAll('[data-qkv-control="position"] input').forEach(function (input) {
      if (input.checked) render(Number(input.value), false);
      input.addEventListener("change", function () {
        render(Number(input.value), true);
      });
    });
    controls.hidden = false;
  }

  WIDGETS["position-sweep"] = setupSweep;
