  function init() {
    FEATURES.forEach(function (setup) {
      setup();
    });
    Object.keys(WIDGETS).forEach(function (kind) {
      document.querySelectorAll('[data-qkv-widget="' + kind + '"]').forEach(WIDGETS[kind]);
    });
    document.documentElement.classList.add("qkv-js");
    // Outside tools wait on this rather than guess when the page is live.
    document.documentElement.setAttribute("data-qkv-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
