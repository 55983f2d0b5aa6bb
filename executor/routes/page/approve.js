"use strict";
// The approval page: every value an agent wrote arrives from the API already inert (display.*)
// and is set with textContent only; nothing is ever parsed as HTML.
(function () {
  const $ = (id) => document.getElementById(id);
  const status = (text) => { $("status").textContent = text; };
  const page = location.pathname.split("/").filter(Boolean);
  const enrolling = page[1] === "enrol";
  const requestId = enrolling ? null : page[1];
  const enrolToken = new URLSearchParams(location.hash.slice(1)).get("token");
  if (enrolToken) history.replaceState(null, "", location.pathname);
  let credential = "";
  let item = null;

  async function api(method, path, body) {
    const headers = { "content-type": "application/json" };
    if (credential) headers.authorization = "Bearer " + credential;
    const response = await fetch(path, {
      method, headers, credentials: "same-origin", cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const payload = await response.json();
    if (!response.ok) {
      const error = payload.error || {};
      throw new Error((error.code || response.status) + ": " + (error.message || ""));
    }
    return payload;
  }

  function show(data) {
    item = data;
    const d = data.display;
    $("f-request").textContent = data.request_id;
    $("f-state").textContent = data.state;
    $("f-action").textContent = d.action;
    $("f-target").textContent = d.target;
    $("f-amount").textContent = d.amount === null ? "(no amountMinor/currency)" : d.amount;
    $("f-parameters").textContent = d.parameters;
    $("f-proposer").textContent = d.proposer;
    $("f-rule").textContent = data.rule === null ? "(none)" : data.rule;
    $("f-reason").textContent = data.reason_codes.join(", ");
    $("f-hash").textContent = data.intent.intent_hash;
    $("f-expires").textContent = data.expires_at;
    $("f-verification").textContent = data.verification.required +
      (data.passkeys ? " (you have " + data.passkeys + " passkey(s))" : "");
    $("f-intent").textContent = d.intent;
    const warnings = $("f-warnings");
    warnings.replaceChildren();
    for (const text of d.warnings || []) {
      const entry = document.createElement("li");
      entry.textContent = "\u26a0 " + text;
      warnings.appendChild(entry);
    }
    $("warnings").hidden = warnings.childElementCount === 0;
    $("decide").hidden = data.state !== "PENDING";
    $("request").hidden = false;
  }

  async function load() {
    show(await api("GET", "/v1/approvals/" + encodeURIComponent(requestId)));
  }

  async function decide(decision) {
    const reason = $("reason").value.trim();
    if (!reason) { status("Give a reason for your decision."); return; }
    const body = { decision, reason };
    if (item.verification.required === "WEBAUTHN" || item.passkeys > 0) {
      status("Touch your passkey to " + decision.toLowerCase() + " this exact intent ...");
      const challenge = await api("POST", "/v1/approvals/" + encodeURIComponent(requestId) + "/challenge", { decision });
      const options = PublicKeyCredential.parseRequestOptionsFromJSON(challenge.publicKey);
      const assertion = await navigator.credentials.get({ publicKey: options });
      body.webauthn = { challenge_token: challenge.challenge_token, credential: assertion.toJSON() };
    }
    const decided = await api("POST", "/v1/approvals/" + encodeURIComponent(requestId), body);
    show(decided);
    status(decided.state + " by " + decided.decided_by + " (" + decided.verification.decided_with + ")");
  }

  async function register() {
    status("Creating a passkey ...");
    const options = await api("POST", "/v1/approvers/enrolment/options", { token: enrolToken });
    const created = await navigator.credentials.create({
      publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options.publicKey),
    });
    const done = await api("POST", "/v1/approvers/enrolment", {
      token: enrolToken, challenge_token: options.challenge_token, credential: created.toJSON(),
    });
    status("Passkey registered for " + done.principal + ".");
  }

  const guard = (fn) => (event) => {
    if (event) event.preventDefault();
    fn().catch((error) => status("Refused: " + error.message));
  };
  $("signin").addEventListener("submit", guard(async () => {
    credential = $("credential").value;
    $("credential").value = "";
    $("signin").hidden = true;
    if (enrolling) {
      if (!enrolToken) throw new Error("this page needs the enrolment link an operator issued");
      $("title").textContent = "agentsafe: register a passkey";
      $("enrol").hidden = false;
      status("Signed in.");
    } else {
      try {
        await load();
      } catch (error) {
        $("signin").hidden = false;  // let the person try another credential
        throw error;
      }
      status("Signed in.");
    }
  }));
  $("approve").addEventListener("click", guard(() => decide("APPROVE")));
  $("deny").addEventListener("click", guard(() => decide("DENY")));
  $("register").addEventListener("click", guard(register));
})();
