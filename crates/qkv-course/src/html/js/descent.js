  /* ---------- gradient-descent widgets ---------- */

  /* A gradient block's steps. The build wrote every step's readouts as the page shows them, from
   * the engine's forward and backward, so stepping only swaps text in (`stepButtons` is
   * decode.js's). */
  function setupDescent(root) {
    var data = json(root, "script[data-qkv-data]");
    var prev = root.querySelector("[data-qkv-prev]");
    var next = root.querySelector("[data-qkv-next]");
    if (!data || !prev || !next) return;
    var announce = root.querySelector("[data-qkv-announce]");
    stepButtons(prev, next, 0, data.steps.length - 1, function (i) {
      var step = data.steps[i];
      root.querySelector("[data-qkv-title]").textContent = step.title;
      Object.keys(step.readouts).forEach(function (name) {
        var cell = root.querySelector('[data-qkv-readout="' + CSS.escape(name) + '"]');
        if (cell) cell.textContent = step.readouts[name];
      });
      announce.textContent = step.announce;
      root.setAttribute("data-qkv-step", String(i));
    }, announce);
  }

  WIDGETS["gradient-descent"] = setupDescent;
