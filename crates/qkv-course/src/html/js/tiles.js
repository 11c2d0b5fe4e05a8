  /* ---------- tile-stepper widgets ---------- */

  /* The states (before any block, after each block, the result) come from the build, as the
   * text to show: the script switches between them and computes nothing. The buttons stay
   * focusable at either end (aria-disabled, not disabled), so the focus never drops. */
  function setupTiles(root) {
    var data = json(root, "[data-qkv-data]");
    var stepper = root.querySelector("[data-qkv-stepper]");
    if (!data || !stepper) return;
    var states = data.states;
    var prev = root.querySelector("[data-qkv-prev]");
    var next = root.querySelector("[data-qkv-next]");
    var announce = root.querySelector("[data-qkv-announce]");
    var at = 0;
    function show(i, speak) {
      var s = states[i];
      at = i;
      root.setAttribute("data-qkv-step", String(i));
      root.querySelector("[data-qkv-title]").textContent = s.title;
      root.querySelectorAll("[data-qkv-readout]").forEach(function (cell) {
        var text = s.readouts[cell.getAttribute("data-qkv-readout")];
        cell.textContent = text === undefined ? "" : text;
        cell.parentNode.hidden = text === undefined;
      });
      prev.setAttribute("aria-disabled", i === 0 ? "true" : "false");
      next.setAttribute("aria-disabled", i === states.length - 1 ? "true" : "false");
      if (speak) announce.textContent = s.announce;
    }
    prev.addEventListener("click", function () {
      if (at > 0) show(at - 1, true);
    });
    next.addEventListener("click", function () {
      if (at < states.length - 1) show(at + 1, true);
    });
    stepper.hidden = false;
    root.querySelector("[data-qkv-all]").hidden = true;
    show(0, false);
  }

  WIDGETS["tile-stepper"] = setupTiles;
