"""The report: the run's recorded settings and facts (`facts`), the HTML pages (`html`), the landing
page (`landing`); command `encoder-study report`."""
