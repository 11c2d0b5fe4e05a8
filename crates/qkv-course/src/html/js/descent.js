  /* ---------- gradient-descent widgets ---------- */

  /* A gradient block's steps. The build wrote every step's readouts as the page shows them, from
   * the engine's forward and backward, so stepping only swaps text in. The buttons stay
   * focusable at either end (aria-disabled), so the focus never drops to the page. */
  function setupDescent(root) {
    var data = json(root, "script[data-qkv-data]");
    var prev = root.querySelector("[data-qkv-prev]");
    var next = root.querySelector("[data-qkv-next]");
    if (!data || !prev || !next) return;
    var at = 0;
    var last = data.steps.length - 1;
    function show(i) {
      if (i < 0 || i > last) return;
      at = i;
      var step = data.steps[at];
      root.querySelector("[data-qkv-title]").textContent = step.title;
      Object.keys(step.readouts).forEach(function (name) {
        var cell = root.querySelector('[data-qkv-readout="' + CSS.escape(name) + '"]');
        if (cell) cell.textContent = step.readouts[name];
      });
      root.querySelector("[data-qkv-announce]").textContent = step.announce;
      root.setAttribute("data-qkv-step", String(at));
      state();
    }
    function state() {
      prev.setAttribute("aria-disabled", at === 0 ? "true" : "false");
      next.setAttribute("aria-disabled", at === last ? "true" : "false");
    }
    prev.addEventListener("click", function () {
      show(at - 1);
    });
    next.addEventListener("click", function () {
      show(at + 1);
    });
    prev.parentNode.hidden = false;
    state();
  }

  WIDGETS["gradient-descent"] = setupDescent;
